//! The corridor task (Expire-Span paper, section 5.2 and A.3.1, Figure 3 left): the
//! agent starts at one end of a corridor next to an object that is red or blue; at the
//! far end are two doors, one of each colour. Walking through the door of the object's
//! colour gives +1; the other door ends the episode with nothing. The agent only needs
//! to remember one colour, for as long as the walk takes.
//!
//! The map, for a corridor of `n` cells (here `n = 6`, a red object, the red door below):
//!
//! ```text
//! #r####B#      y = 0: walls, the object above the start, a door above the last cell
//! #A.....#      y = 1: the corridor, x = 1..=n, the agent starting at x = 1
//! ######R#      y = 2: walls and the other door below the last cell
//! ```
//!
//! The object is a block (the agent cannot step on it). Which door is on top is drawn
//! per episode, as are the colour and the length `n ~ U(length_min, length_max)`.

use serde::{Deserialize, Serialize};

use super::grid::{shown, shown_part, Action, Colour, Outcome, Word};
use crate::task::spec::{Metric, Task};
use lethe_core::config::{CorridorConfig, DataConfig};
use lethe_core::rng::Rng;

/// One corridor episode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Corridor {
    /// Cells of the corridor `n`.
    pub length: usize,
    /// The object's colour: the right door.
    pub colour: Colour,
    /// The colour of the door above the last cell (the other one is below it).
    pub top_door: Colour,
    /// The agent's cell, `1..=length` (row 1).
    pub x: usize,
    /// The door the agent walked through, once it has.
    pub exit: Option<Colour>,
}

impl Corridor {
    /// A new episode drawn from `rng`.
    pub fn new(cfg: &CorridorConfig, rng: &mut Rng) -> Corridor {
        let length = rng.range(cfg.length_min, cfg.length_max);
        let colour = Colour::draw(rng);
        let top_door = Colour::draw(rng);
        Corridor { length, colour, top_door, x: 1, exit: None }
    }

    /// The agent's position `(x, y)`.
    pub fn agent(&self) -> (i64, i64) {
        (self.x as i64, 1)
    }

    /// The words on `(x, y)`.
    pub fn cell(&self, x: i64, y: i64) -> Vec<Word> {
        let n = self.length as i64;
        match (x, y) {
            (x, 1) if x == self.x as i64 => vec![Word::Agent],
            (x, 1) if (1..=n).contains(&x) => vec![],
            (1, 0) => vec![Word::Object, self.colour.word()],
            (x, 0) if x == n => vec![Word::Door, self.top_door.word()],
            (x, 2) if x == n => vec![Word::Door, self.top_door.other().word()],
            _ => vec![Word::Block],
        }
    }

    /// Moves the agent; through a door the episode ends, with +1 for the right one.
    pub fn step(&mut self, action: Action) -> Outcome {
        let at_end = self.x == self.length;
        match action {
            Action::Left if self.x > 1 => self.x -= 1,
            Action::Right if self.x < self.length => self.x += 1,
            Action::Up if at_end => self.exit = Some(self.top_door),
            Action::Down if at_end => self.exit = Some(self.top_door.other()),
            _ => {}
        }
        match self.exit {
            Some(door) => Outcome { reward: if door == self.colour { 1.0 } else { 0.0 }, done: true },
            None => Outcome::default(),
        }
    }

    /// Whether the agent walked through the right door.
    pub fn succeeded(&self) -> bool {
        self.exit == Some(self.colour)
    }

    /// The map as text: `#` wall, `A` agent, `r`/`b` the object, `R`/`B` the doors. A
    /// corridor longer than [`SHOWN`](super::grid::SHOWN) columns shows those around the agent, under a line
    /// that says which.
    pub fn render(&self) -> String {
        let letter = |c: Colour, upper: bool| match (c, upper) {
            (Colour::Red, true) => 'R',
            (Colour::Blue, true) => 'B',
            (Colour::Red, false) => 'r',
            (Colour::Blue, false) => 'b',
        };
        let width = self.length as i64 + 2;
        let columns = shown(width, self.x as i64);
        let mut out = shown_part("columns", &columns, width).map_or(String::new(), |part| format!("{part}\n"));
        for y in 0..3 {
            for x in columns.clone() {
                let words = self.cell(x, y);
                let colour = words.iter().find_map(|w| match w {
                    Word::Red => Some(Colour::Red),
                    Word::Blue => Some(Colour::Blue),
                    _ => None,
                });
                out.push(match (words.first(), colour) {
                    (Some(Word::Agent), _) => 'A',
                    (Some(Word::Door), Some(c)) => letter(c, true),
                    (Some(Word::Object), Some(c)) => letter(c, false),
                    (None, _) => '.',
                    _ => '#',
                });
            }
            out.push('\n');
        }
        out
    }
}

/// The corridor in the registry ([`crate::task::of`]).
pub struct CorridorSpec;

impl Task for CorridorSpec {
    fn name(&self) -> &'static str {
        "corridor"
    }

    fn describe(&self, d: &DataConfig) -> String {
        let c = &d.corridor;
        format!(
            "corridor gridworld, lengths {}-{}, at most {} steps per episode; chance success 50%",
            c.length_min, c.length_max, c.max_steps
        )
    }

    fn metric(&self) -> Metric {
        Metric::Success
    }

    fn is_episodic(&self) -> bool {
        true
    }

    /// The longest corridor.
    fn set_length(&self, d: &mut DataConfig, n: usize) -> bool {
        d.corridor.length_max = n;
        true
    }

    /// The corridor lengths.
    fn set_distance(&self, d: &mut DataConfig, min: usize, max: usize) -> bool {
        (d.corridor.length_min, d.corridor.length_max) = (min, max);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gridworld::grid::SHOWN;

    fn corridor(length: usize, colour: Colour, top_door: Colour) -> Corridor {
        Corridor { length, colour, top_door, x: 1, exit: None }
    }

    #[test]
    fn the_map_has_the_object_at_the_start_and_the_doors_at_the_end() {
        let c = corridor(6, Colour::Red, Colour::Blue);
        assert_eq!(c.render(), "#r####B#\n#A.....#\n######R#\n");
    }

    #[test]
    fn a_corridor_too_long_to_print_shows_the_columns_around_the_agent() {
        let mut c = corridor(100_000_000_000, Colour::Red, Colour::Blue);
        c.x = 50_000;
        let map = c.render();
        let lines: Vec<&str> = map.lines().collect();
        assert_eq!(lines[0], "columns 49800-50199 of 100000000002");
        assert_eq!(lines.len(), 4);
        assert!(lines[1..].iter().all(|l| l.chars().count() == SHOWN as usize), "{map}");
        assert_eq!(lines[2].find('A'), Some(200));
    }

    #[test]
    fn walls_and_the_object_block_the_agent() {
        let mut c = corridor(4, Colour::Blue, Colour::Blue);
        for a in [Action::Left, Action::Up, Action::Down] {
            assert_eq!(c.step(a), Outcome::default());
            assert_eq!(c.x, 1, "{a:?}");
        }
        for _ in 0..10 {
            c.step(Action::Right);
        }
        assert_eq!(c.x, 4, "the agent stops at the last cell");
        assert!(c.exit.is_none());
    }

    #[test]
    fn the_right_door_pays_one_and_the_wrong_door_nothing() {
        for (top, action, reward) in [
            (Colour::Red, Action::Up, 1.0),
            (Colour::Red, Action::Down, 0.0),
            (Colour::Blue, Action::Up, 0.0),
            (Colour::Blue, Action::Down, 1.0),
        ] {
            let mut c = corridor(3, Colour::Red, top);
            c.step(Action::Right);
            assert_eq!(c.step(action), Outcome::default(), "no door before the end");
            assert_eq!(c.x, 2);
            c.step(Action::Right);
            assert_eq!(c.step(action), Outcome { reward, done: true }, "top {top:?}, {action:?}");
            assert_eq!(c.succeeded(), reward == 1.0);
            let progress = crate::gridworld::env::World::Corridor(c).progress();
            assert_eq!(progress, if reward == 1.0 { (1, 0) } else { (0, 1) }, "the door counted as right or wrong");
        }
    }

    #[test]
    fn lengths_and_colours_cover_their_ranges() {
        let cfg = CorridorConfig { length_min: 3, length_max: 5, max_steps: 100 };
        let mut rng = Rng::new(7);
        let episodes: Vec<Corridor> = (0..400).map(|_| Corridor::new(&cfg, &mut rng)).collect();
        for n in 3..=5 {
            assert!(episodes.iter().any(|c| c.length == n), "length {n} never drawn");
        }
        assert!(episodes.iter().all(|c| (3..=5).contains(&c.length)));
        let red = episodes.iter().filter(|c| c.colour == Colour::Red).count();
        assert!((150..250).contains(&red), "{red} red objects of 400");
        let red_top = episodes.iter().filter(|c| c.top_door == Colour::Red).count();
        assert!((150..250).contains(&red_top), "{red_top} red top doors of 400");
    }
}
