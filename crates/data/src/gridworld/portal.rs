//! The multi-room portal task (Expire-Span paper, section 5.2 and A.3.1, Figure 3
//! middle): `rooms` rooms of `size x size` cells in a sequence. Each room has two doors
//! of different colours in its top wall. The correct door of each room is drawn per
//! episode and fixed within it: it teleports the agent to the next room; the wrong one
//! sends it back to the first room. Nothing in the room tells which door is correct, so
//! the agent must find out by trial and error and remember it. The room number is
//! visible (the word "room k" on the agent's cell).
//!
//! - Moving from room `k` to room `k + 1` (1-based) gives `0.1 k`.
//! - The episode ends after `mistakes` (2) wrong doors in the same room, on reaching the
//!   last room, or at the step limit (1000).
//! - The agent enters every room at the middle of its bottom row. The doors' places in
//!   the top wall and their colours are drawn per room and episode.
//! - A door taken in a room where the episode has taken a door before is an *informed*
//!   choice: memory alone can tell which door is right there (the one passed before, or
//!   the other one after a mistake). The share of informed choices that are correct, the
//!   *recall*, is 50% without memory and 100% with a perfect one, which makes it the
//!   direct measure of memory use that the rooms reached only hint at.
//!
//! A room of size 5, the agent at its entrance, a red and a blue door:
//!
//! ```text
//! #R#B###
//! #.....#
//! #.....#
//! #.....#
//! #.....#
//! #..A..#
//! #######
//! ```

use serde::{Deserialize, Serialize};

use super::grid::{shown, shown_part, Action, Colour, Outcome, Word};
use crate::task::spec::{Metric, Task};
use lethe_core::config::{DataConfig, PortalConfig};
use lethe_core::rng::Rng;

/// The doors of one room.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Doors {
    /// Columns of the two doors in the top wall (`1..=size`, distinct).
    pub x: [usize; 2],
    /// Colour of the first door (the second has the other colour).
    pub first: Colour,
    /// Which door (0 or 1) leads on.
    pub correct: usize,
}

/// One portal episode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Portal {
    /// Side of a room's floor.
    pub size: usize,
    /// Wrong doors in one room that end the episode.
    pub max_mistakes: usize,
    /// The doors of every room.
    pub doors: Vec<Doors>,
    /// Current room, 0-based.
    pub room: usize,
    /// The agent's cell in the room (floor: `1..=size` both ways; the top wall is row 0).
    pub pos: (usize, usize),
    /// Wrong doors taken in each room.
    pub mistakes: Vec<usize>,
    /// The furthest room reached, 0-based.
    pub best: usize,
    /// Informed door choices so far (see the module documentation).
    #[serde(default)]
    pub informed: usize,
    /// Informed door choices that were correct.
    #[serde(default)]
    pub recalled: usize,
}

impl Portal {
    /// A new episode drawn from `rng`.
    pub fn new(cfg: &PortalConfig, rng: &mut Rng) -> Portal {
        let doors = (0..cfg.rooms)
            .map(|_| {
                let a = rng.range(1, cfg.size);
                let b = rng.range(1, cfg.size - 1);
                let b = if b >= a { b + 1 } else { b };
                Doors { x: [a, b], first: Colour::draw(rng), correct: rng.range(0, 1) }
            })
            .collect();
        Portal {
            size: cfg.size,
            max_mistakes: cfg.mistakes,
            doors,
            room: 0,
            pos: Self::entrance(cfg.size),
            mistakes: vec![0; cfg.rooms],
            best: 0,
            informed: 0,
            recalled: 0,
        }
    }

    /// Where the agent enters a room: the middle of the bottom row.
    pub fn entrance(size: usize) -> (usize, usize) {
        (size / 2 + 1, size)
    }

    /// The agent's position `(x, y)` in its room.
    pub fn agent(&self) -> (i64, i64) {
        (self.pos.0 as i64, self.pos.1 as i64)
    }

    /// The colour of door `i` of the current room.
    fn colour(&self, i: usize) -> Colour {
        let d = &self.doors[self.room];
        if i == 0 {
            d.first
        } else {
            d.first.other()
        }
    }

    /// Which door, if any, is at `(x, y)` of the current room.
    fn door_at(&self, x: i64, y: i64) -> Option<usize> {
        (y == 0).then(|| self.doors[self.room].x.iter().position(|&dx| dx as i64 == x)).flatten()
    }

    /// The words on `(x, y)` of the current room.
    pub fn cell(&self, x: i64, y: i64) -> Vec<Word> {
        let s = self.size as i64;
        if (x, y) == self.agent() {
            return vec![Word::Agent, Word::Room(self.room + 1)];
        }
        if let Some(i) = self.door_at(x, y) {
            return vec![Word::Door, self.colour(i).word()];
        }
        if (1..=s).contains(&x) && (1..=s).contains(&y) {
            return vec![];
        }
        vec![Word::Block]
    }

    /// Moves the agent; a door teleports it (see the module documentation).
    pub fn step(&mut self, action: Action) -> Outcome {
        let (dx, dy) = action.delta();
        let (x, y) = (self.pos.0 as i64 + dx, self.pos.1 as i64 + dy);
        let s = self.size as i64;
        if let Some(i) = self.door_at(x, y) {
            return self.through(i);
        }
        if (1..=s).contains(&x) && (1..=s).contains(&y) {
            self.pos = (x as usize, y as usize);
        }
        Outcome::default()
    }

    fn through(&mut self, door: usize) -> Outcome {
        self.pos = Self::entrance(self.size);
        let correct = door == self.doors[self.room].correct;
        if self.room < self.best || self.mistakes[self.room] > 0 {
            self.informed += 1;
            self.recalled += usize::from(correct);
        }
        if correct {
            let reward = 0.1 * (self.room + 1) as f64;
            self.room += 1;
            self.best = self.best.max(self.room);
            return Outcome { reward, done: self.room + 1 == self.doors.len() };
        }
        self.mistakes[self.room] += 1;
        let done = self.mistakes[self.room] >= self.max_mistakes;
        self.room = 0;
        Outcome { reward: 0.0, done }
    }

    /// Whether the agent has reached the last room.
    pub fn reached_last(&self) -> bool {
        self.best + 1 == self.doors.len()
    }

    /// The furthest room reached, 1-based.
    pub fn best_room(&self) -> usize {
        self.best + 1
    }

    /// The current room as text, under a line `room k/N`: `#` wall, `A` agent, `R`/`B`
    /// the doors. A room wider than [`SHOWN`](super::grid::SHOWN) cells shows those around the agent, and
    /// the line says which.
    pub fn render(&self) -> String {
        let side = self.size as i64 + 2;
        let (columns, rows) = (shown(side, self.pos.0 as i64), shown(side, self.pos.1 as i64));
        let mut out = format!("room {}/{}", self.room + 1, self.doors.len());
        for part in [shown_part("columns", &columns, side), shown_part("rows", &rows, side)].into_iter().flatten() {
            out += &format!(", {part}");
        }
        out.push('\n');
        for y in rows {
            for x in columns.clone() {
                let words = self.cell(x, y);
                out.push(match words.as_slice() {
                    [Word::Agent, ..] => 'A',
                    [Word::Door, Word::Red] => 'R',
                    [Word::Door, Word::Blue] => 'B',
                    [] => '.',
                    _ => '#',
                });
            }
            out.push('\n');
        }
        out
    }
}

/// The portal in the registry ([`crate::task::of`]).
pub struct PortalSpec;

impl Task for PortalSpec {
    fn name(&self) -> &'static str {
        "portal"
    }

    fn describe(&self, d: &DataConfig) -> String {
        let p = &d.portal;
        format!(
            "multi-room portal gridworld, {} rooms of {}x{}, {} mistakes per room end an episode, at most {} steps",
            p.rooms, p.size, p.size, p.mistakes, p.max_steps
        )
    }

    fn metric(&self) -> Metric {
        Metric::Rooms
    }

    fn is_episodic(&self) -> bool {
        true
    }

    /// The rooms per episode.
    fn set_length(&self, d: &mut DataConfig, n: usize) -> bool {
        d.portal.rooms = n;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gridworld::grid::SHOWN;

    /// Three rooms of size 3; in every room the red door at x = 1 is correct, the blue
    /// one at x = 3 is not.
    fn portal() -> Portal {
        let doors = vec![Doors { x: [1, 3], first: Colour::Red, correct: 0 }; 3];
        Portal {
            size: 3,
            max_mistakes: 2,
            doors,
            room: 0,
            pos: Portal::entrance(3),
            mistakes: vec![0; 3],
            best: 0,
            informed: 0,
            recalled: 0,
        }
    }

    fn walk(p: &mut Portal, moves: &str) -> Vec<Outcome> {
        moves
            .chars()
            .map(|c| {
                let a = match c {
                    'U' => Action::Up,
                    'D' => Action::Down,
                    'L' => Action::Left,
                    _ => Action::Right,
                };
                p.step(a)
            })
            .collect()
    }

    #[test]
    fn the_room_renders_with_its_doors_and_number() {
        assert_eq!(portal().render(), "room 1/3\n#R#B#\n#...#\n#...#\n#.A.#\n#####\n");
    }

    #[test]
    fn a_room_too_wide_to_print_shows_the_cells_around_the_agent() {
        let size = 1_000_000;
        let p = Portal { size, pos: Portal::entrance(size), ..portal() };
        let map = p.render();
        let lines: Vec<&str> = map.lines().collect();
        assert_eq!(lines[0], "room 1/3, columns 499801-500200 of 1000002, rows 999602-1000001 of 1000002");
        assert_eq!(lines.len(), 1 + SHOWN as usize);
        assert!(lines[1..].iter().all(|l| l.chars().count() == SHOWN as usize), "{}", lines[1]);
        assert_eq!(lines[SHOWN as usize - 1].find('A'), Some(200), "the agent, on the bottom row of the floor");
        assert!(lines[SHOWN as usize].chars().all(|c| c == '#'), "the bottom wall");
    }

    #[test]
    fn the_correct_door_leads_on_with_a_reward_of_a_tenth_of_the_room_number() {
        let mut p = portal();
        let out = walk(&mut p, "UULU");
        assert_eq!(out[..3], [Outcome::default(); 3]);
        assert_eq!(out[3], Outcome { reward: 0.1, done: false });
        assert_eq!((p.room, p.pos), (1, (2, 3)), "room 2, at the entrance");
        assert!(p.cell(2, 3).contains(&Word::Room(2)));
        let out = walk(&mut p, "UULU");
        assert!((out[3].reward - 0.2).abs() < 1e-12);
        assert!(out[3].done, "reaching the last room ends the episode");
        assert!(p.reached_last());
        assert_eq!(p.best_room(), 3);
    }

    #[test]
    fn a_wrong_door_sends_the_agent_back_and_two_in_one_room_end_the_episode() {
        let mut p = portal();
        walk(&mut p, "UULU"); // room 2
        let out = walk(&mut p, "UURU");
        assert_eq!(out[3], Outcome { reward: 0.0, done: false });
        assert_eq!((p.room, p.pos, p.mistakes[1]), (0, (2, 3), 1), "back in room 1");
        walk(&mut p, "UURU"); // a mistake in room 1: one there, one in room 2
        assert_eq!(p.mistakes[..2], [1, 1]);
        walk(&mut p, "UULU"); // room 2 again
        let out = walk(&mut p, "UURU");
        assert!(out[3].done, "the second mistake in room 2 ends the episode");
        assert_eq!(p.best_room(), 2);
        assert!(!p.reached_last());
    }

    #[test]
    fn progress_tells_which_door_each_step_took() {
        use crate::gridworld::env::{door_taken, World};
        let mut world = World::Portal(portal());
        let mut doors = vec![];
        // Right in room 1, wrong in room 2 (back to 1), right in room 1 again.
        for moves in ["UULU", "UURU", "UULU"] {
            for c in moves.chars() {
                let before = world.progress();
                let World::Portal(p) = &mut world else { unreachable!() };
                walk(p, &c.to_string());
                doors.push(door_taken(before, world.progress()));
            }
        }
        let taken: Vec<(usize, bool)> = doors.iter().enumerate().filter_map(|(i, d)| d.map(|d| (i, d))).collect();
        assert_eq!(taken, vec![(3, true), (7, false), (11, true)]);
        assert_eq!(world.progress(), (1, 1), "room 2 (0-based 1), one wrong door");
    }

    #[test]
    fn only_choices_in_rooms_where_a_door_was_taken_before_are_informed() {
        let mut p = portal();
        walk(&mut p, "UULU"); // room 1 passed: first visit, not informed
        walk(&mut p, "UURU"); // wrong in room 2: first visit, not informed
        assert_eq!((p.informed, p.recalled), (0, 0));
        walk(&mut p, "UULU"); // room 1 again, passed before: informed, right
        assert_eq!((p.informed, p.recalled), (1, 1));
        walk(&mut p, "UURU"); // room 2 again after a mistake there: informed, wrong
        assert_eq!((p.informed, p.recalled), (2, 1));
        assert!(p.mistakes[1] == 2, "and the episode is over");
    }

    #[test]
    fn walls_stop_the_agent_and_it_sees_only_its_room() {
        let mut p = portal();
        walk(&mut p, "DDRRRR");
        assert_eq!(p.pos, (3, 3));
        walk(&mut p, "LUUU");
        assert_eq!(p.pos, (2, 1), "the wall between the doors holds");
        assert_eq!(p.room, 0);
        assert_eq!(p.cell(3, 0), vec![Word::Door, Word::Blue]);
        assert_eq!(p.cell(2, 0), vec![Word::Block]);
        assert_eq!(p.cell(9, 9), vec![Word::Block]);
    }

    #[test]
    fn door_places_are_distinct_and_cover_the_wall() {
        let cfg = PortalConfig { rooms: 200, size: 5, ..PortalConfig::default() };
        let p = Portal::new(&cfg, &mut Rng::new(3));
        assert!(p.doors.iter().all(|d| d.x[0] != d.x[1] && d.x.iter().all(|x| (1..=5).contains(x))));
        for x in 1..=5 {
            assert!(p.doors.iter().any(|d| d.x.contains(&x)), "no door at column {x}");
        }
        let first_correct = p.doors.iter().filter(|d| d.correct == 0).count();
        assert!((70..130).contains(&first_correct), "{first_correct} of 200");
        // Rooms of 2x2 (the small presets): the doors fill the top wall, in either order.
        let p = Portal::new(&PortalConfig { rooms: 50, size: 2, ..PortalConfig::default() }, &mut Rng::new(4));
        assert!(p.doors.iter().all(|d| matches!(d.x, [1, 2] | [2, 1])));
        assert!(p.doors.iter().any(|d| d.x == [1, 2]) && p.doors.iter().any(|d| d.x == [2, 1]));
        assert_eq!(Portal::entrance(2), (2, 2));
    }
}
