//! What the gridworlds share: words, observations, actions, and a batch of episodes
//! stepped together (Expire-Span paper, A.3.1; MazeBase, Sukhbaatar et al., 2015).
//!
//! - Every object and property is a word ("agent", "block", "door", "red", ...). A cell
//!   is the set of words on it, and an observation is the 3x3 area around the agent as a
//!   binary tensor `3 x 3 x vocabulary`, flattened row by row (top row first), word
//!   fastest. Cells outside the map read as "block".
//! - The actions are the four moves. Moving into a block (a wall, or the corridor's
//!   object) leaves the agent where it is.
//! - [`Episodes`] steps `B` episodes together, one per row. Either each row plays
//!   episodes back to back ([`Episodes::refill`] starts a new one where one has ended),
//!   or they start together and the batch is over when every one of them has ended: an
//!   episode that ends early then waits, inactive, for the others (see `rl.reset` and
//!   `rl::train`). Each episode is drawn from its own random stream, derived from the
//!   seed and the episode's number, so the same seed gives the same episodes.

use serde::{Deserialize, Serialize};

pub use super::grid::{Action, Colour, Outcome, Word, FIXED_WORDS, VIEW};

use super::corridor::Corridor;
use super::portal::Portal;
use lethe_core::config::{Config, Source};
use lethe_core::error::{LetheError, Result};
use lethe_core::rng::Rng;

/// One episode of either task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum World {
    /// The corridor task.
    Corridor(Corridor),
    /// The multi-room portal task.
    Portal(Portal),
}

impl World {
    /// A new episode of the task `cfg` describes, drawn from `rng`.
    pub fn new(cfg: &Config, rng: &mut Rng) -> Result<World> {
        match cfg.data.source {
            Source::Corridor => Ok(World::Corridor(Corridor::new(&cfg.data.corridor, rng))),
            Source::Portal => Ok(World::Portal(Portal::new(&cfg.data.portal, rng))),
            other => Err(LetheError::Invalid(format!(
                "data.source = \"{other}\" is not a reinforcement-learning task (corridor, portal)"
            ))),
        }
    }

    /// Moves the agent.
    pub fn step(&mut self, action: Action) -> Outcome {
        match self {
            World::Corridor(c) => c.step(action),
            World::Portal(p) => p.step(action),
        }
    }

    /// The words on cell `(x, y)` of the map (outside the map: a block).
    pub fn cell(&self, x: i64, y: i64) -> Vec<Word> {
        match self {
            World::Corridor(c) => c.cell(x, y),
            World::Portal(p) => p.cell(x, y),
        }
    }

    /// The agent's position.
    pub fn agent(&self) -> (i64, i64) {
        match self {
            World::Corridor(c) => c.agent(),
            World::Portal(p) => p.agent(),
        }
    }

    /// Writes the 3x3 view into `out` (`VIEW * VIEW * vocab` zeros on entry).
    pub fn observe(&self, vocab: usize, out: &mut [f32]) {
        let (ax, ay) = self.agent();
        let r = (VIEW / 2) as i64;
        for (row, dy) in (-r..=r).enumerate() {
            for (col, dx) in (-r..=r).enumerate() {
                let base = (row * VIEW + col) * vocab;
                for w in self.cell(ax + dx, ay + dy) {
                    out[base + w.index()] = 1.0;
                }
            }
        }
    }

    /// Whether the episode counts as a success (the corridor's right door, the portal's
    /// last room).
    pub fn success(&self) -> bool {
        match self {
            World::Corridor(c) => c.succeeded(),
            World::Portal(p) => p.reached_last(),
        }
    }

    /// The furthest room reached (1-based), for the portal task.
    pub fn rooms_reached(&self) -> Option<usize> {
        match self {
            World::Corridor(_) => None,
            World::Portal(p) => Some(p.best_room()),
        }
    }

    /// Informed door choices and how many were correct, for the portal task (see
    /// [`crate::gridworld::portal`]); `(0, 0)` for the corridor.
    pub fn recall(&self) -> (usize, usize) {
        match self {
            World::Corridor(_) => (0, 0),
            World::Portal(p) => (p.informed, p.recalled),
        }
    }

    /// Doors taken so far, as `(right, wrong)` for the corridor (its one door ends the
    /// episode) and `(room, wrong)` for the portal (the 0-based room, which a right door
    /// raises by one and a wrong door resets). Both start at `(0, 0)`, so comparing two
    /// readings tells which door a step took (see [`door_taken`]).
    pub fn progress(&self) -> (usize, usize) {
        match self {
            World::Corridor(c) => match c.exit {
                Some(door) if door == c.colour => (1, 0),
                Some(_) => (0, 1),
                None => (0, 0),
            },
            World::Portal(p) => (p.room, p.mistakes.iter().sum()),
        }
    }

    /// The map as text, one line per row (see the tasks' `render`).
    pub fn render(&self) -> String {
        match self {
            World::Corridor(c) => c.render(),
            World::Portal(p) => p.render(),
        }
    }
}

/// Which door a step took, from [`World::progress`] before and after it: `Some(true)`
/// for a right door, `Some(false)` for a wrong one, `None` for no door.
pub fn door_taken(before: (usize, usize), after: (usize, usize)) -> Option<bool> {
    if after.1 > before.1 {
        Some(false)
    } else if after.0 > before.0 {
        Some(true)
    } else {
        None
    }
}

/// Words of the task `cfg` describes: the fixed words, plus one per room for the portal.
pub fn vocabulary(cfg: &Config) -> usize {
    match cfg.data.source {
        Source::Portal => FIXED_WORDS + cfg.data.portal.rooms,
        _ => FIXED_WORDS,
    }
}

/// Size of one flattened observation.
pub fn observation_size(cfg: &Config) -> usize {
    VIEW * VIEW * vocabulary(cfg)
}

/// The statistics of one finished episode.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpisodeStats {
    /// Sum of rewards (undiscounted).
    pub ret: f64,
    /// Steps taken.
    pub length: usize,
    /// The task's success (see [`World::success`]).
    pub success: bool,
    /// The furthest room reached, for the portal task (0 otherwise).
    pub rooms: usize,
    /// Portal: door choices in rooms where the episode had taken a door before (0 otherwise).
    pub informed: usize,
    /// Portal: informed choices that were correct.
    pub recalled: usize,
}

/// One episode in a batch, with its running figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slot {
    /// The episode's number (of its random stream), unique within a run.
    #[serde(default)]
    pub number: u64,
    /// The episode.
    pub world: World,
    /// Whether it has ended.
    pub done: bool,
    /// Reward so far.
    pub ret: f64,
    /// Steps so far.
    pub length: usize,
}

/// `B` episodes stepped together. Serialisable, so that a checkpoint holds the batch in
/// progress and a resumed run continues it exactly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Episodes {
    /// The episodes of the current batch.
    pub slots: Vec<Slot>,
    /// Seed of the episodes' random streams.
    pub seed: u64,
    /// Episodes started so far (the next episode's stream number).
    pub started: u64,
    /// The step limit of an episode.
    pub max_steps: usize,
}

impl Episodes {
    /// `batch` fresh episodes of the task `cfg`, drawn from streams `seed`.
    pub fn new(cfg: &Config, batch: usize, seed: u64) -> Result<Episodes> {
        let mut e = Episodes { slots: vec![], seed, started: 0, max_steps: max_steps(cfg) };
        e.restart(cfg, batch)?;
        Ok(e)
    }

    /// Starts `batch` new episodes.
    pub fn restart(&mut self, cfg: &Config, batch: usize) -> Result<()> {
        self.slots = (0..batch).map(|_| self.next_episode(cfg)).collect::<Result<_>>()?;
        Ok(())
    }

    /// Starts a new episode in every row whose episode has ended.
    pub fn refill(&mut self, cfg: &Config) -> Result<()> {
        self.refill_up_to(cfg, u64::MAX)
    }

    /// Starts a new episode in rows whose episode has ended, in row order, as long as
    /// fewer than `total` episodes have been started; the other ended rows stay ended.
    pub fn refill_up_to(&mut self, cfg: &Config, total: u64) -> Result<()> {
        for i in 0..self.slots.len() {
            if self.slots[i].done && self.started < total {
                self.slots[i] = self.next_episode(cfg)?;
            }
        }
        Ok(())
    }

    /// The next episode of the streams.
    fn next_episode(&mut self, cfg: &Config) -> Result<Slot> {
        let number = self.started;
        self.started += 1;
        let world = World::new(cfg, &mut Rng::derive(self.seed, number))?;
        Ok(Slot { number, world, done: false, ret: 0.0, length: 0 })
    }

    /// The number of each row's episode, as a `(B)` list for the memory's episode masks.
    pub fn numbers(&self) -> Vec<i64> {
        self.slots.iter().map(|s| s.number as i64).collect()
    }

    /// Whether every episode of the batch has ended.
    pub fn all_done(&self) -> bool {
        self.slots.iter().all(|s| s.done)
    }

    /// The observations of every episode, `(B, VIEW * VIEW * vocab)` row-major; an
    /// ended episode reads as zeros.
    pub fn observe(&self, vocab: usize) -> Vec<f32> {
        let size = VIEW * VIEW * vocab;
        let mut out = vec![0.0; self.slots.len() * size];
        for (slot, chunk) in self.slots.iter().zip(out.chunks_mut(size)) {
            if !slot.done {
                slot.world.observe(vocab, chunk);
            }
        }
        out
    }

    /// Steps every running episode with its action (ended ones ignore theirs). Returns
    /// each slot's outcome (zero for ended ones) and the statistics of the episodes that
    /// ended at this step. An episode that reaches `max_steps` ends with no reward.
    pub fn step(&mut self, actions: &[Action]) -> (Vec<Outcome>, Vec<EpisodeStats>) {
        let mut outcomes = vec![Outcome::default(); self.slots.len()];
        let mut ended = vec![];
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if slot.done {
                continue;
            }
            let mut o = slot.world.step(actions[i]);
            slot.length += 1;
            slot.ret += o.reward;
            if slot.length >= self.max_steps {
                o.done = true;
            }
            if o.done {
                slot.done = true;
                let (informed, recalled) = slot.world.recall();
                ended.push(EpisodeStats {
                    ret: slot.ret,
                    length: slot.length,
                    success: slot.world.success(),
                    rooms: slot.world.rooms_reached().unwrap_or(0),
                    informed,
                    recalled,
                });
            }
            outcomes[i] = o;
        }
        (outcomes, ended)
    }
}

/// The step limit of an episode of the task `cfg` describes.
pub fn max_steps(cfg: &Config) -> usize {
    match cfg.data.source {
        Source::Portal => cfg.data.portal.max_steps,
        _ => cfg.data.corridor.max_steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gridworld::portal::{Doors, Portal};

    fn corridor_config(lo: usize, hi: usize, max_steps: usize) -> Config {
        let mut c = Config::preset("corridor-small").unwrap();
        c.data.corridor = lethe_core::config::CorridorConfig { length_min: lo, length_max: hi, max_steps };
        c
    }

    /// The words set in cell `(row, col)` of a flattened view.
    fn words(obs: &[f32], vocab: usize, row: usize, col: usize) -> Vec<usize> {
        let base = (row * VIEW + col) * vocab;
        (0..vocab).filter(|&w| obs[base + w] == 1.0).collect()
    }

    #[test]
    fn a_corridor_view_names_every_cell_around_the_agent() {
        let world =
            World::Corridor(Corridor { length: 4, colour: Colour::Blue, top_door: Colour::Red, x: 1, exit: None });
        let mut obs = vec![0.0; VIEW * VIEW * FIXED_WORDS];
        world.observe(FIXED_WORDS, &mut obs);
        let (agent, block, object, blue) =
            (Word::Agent.index(), Word::Block.index(), Word::Object.index(), Word::Blue.index());
        assert_eq!(words(&obs, FIXED_WORDS, 0, 0), vec![block]);
        assert_eq!(words(&obs, FIXED_WORDS, 0, 1), vec![object, blue], "the object above the start");
        assert_eq!(words(&obs, FIXED_WORDS, 1, 0), vec![block], "the wall behind");
        assert_eq!(words(&obs, FIXED_WORDS, 1, 1), vec![agent]);
        assert_eq!(words(&obs, FIXED_WORDS, 1, 2), Vec::<usize>::new(), "the floor ahead is empty");
        assert_eq!(words(&obs, FIXED_WORDS, 2, 1), vec![block]);
        assert_eq!(obs.iter().filter(|&&v| v == 1.0).count(), 9, "six blocks, the object and its colour, the agent");
    }

    #[test]
    fn a_portal_view_shows_the_doors_and_the_room_number() {
        let doors = vec![Doors { x: [2, 3], first: Colour::Blue, correct: 1 }; 4];
        let p = Portal {
            size: 3,
            max_mistakes: 2,
            doors,
            room: 2,
            pos: (2, 1),
            mistakes: vec![0; 4],
            best: 2,
            informed: 0,
            recalled: 0,
        };
        let vocab = FIXED_WORDS + 4;
        let mut obs = vec![0.0; VIEW * VIEW * vocab];
        World::Portal(p).observe(vocab, &mut obs);
        assert_eq!(words(&obs, vocab, 1, 1), vec![Word::Agent.index(), Word::Room(3).index()]);
        assert_eq!(words(&obs, vocab, 0, 1), vec![Word::Door.index(), Word::Blue.index()]);
        assert_eq!(words(&obs, vocab, 0, 2), vec![Word::Door.index(), Word::Red.index()]);
        assert_eq!(words(&obs, vocab, 0, 0), vec![Word::Block.index()]);
    }

    #[test]
    fn episodes_are_drawn_from_the_seed() {
        let cfg = corridor_config(3, 30, 100);
        let a = Episodes::new(&cfg, 16, 5).unwrap();
        assert_eq!(a, Episodes::new(&cfg, 16, 5).unwrap());
        assert_ne!(a.slots, Episodes::new(&cfg, 16, 6).unwrap().slots);
        // The next batch continues the streams: not a repeat of the first.
        let mut b = a.clone();
        b.restart(&cfg, 16).unwrap();
        assert_ne!(a.slots, b.slots);
        assert_eq!(b.started, 32);
    }

    #[test]
    fn an_ended_episode_waits_and_the_step_limit_ends_the_others() {
        let cfg = corridor_config(2, 2, 3);
        let mut e = Episodes::new(&cfg, 2, 1).unwrap();
        let door = |s: &Slot| match &s.world {
            World::Corridor(c) if c.top_door == c.colour => Action::Up,
            _ => Action::Down,
        };
        // Slot 0 walks to the right door; slot 1 bumps into the start wall.
        let (o, ended) = e.step(&[Action::Right, Action::Left]);
        assert_eq!(o, vec![Outcome::default(); 2]);
        assert!(ended.is_empty());
        let right_door = door(&e.slots[0]);
        let (o, ended) = e.step(&[right_door, Action::Left]);
        assert_eq!(o[0], Outcome { reward: 1.0, done: true });
        assert_eq!(
            ended,
            vec![EpisodeStats { ret: 1.0, length: 2, success: true, rooms: 0, informed: 0, recalled: 0 }]
        );
        let (o, ended) = e.step(&[Action::Right, Action::Left]);
        assert_eq!(o[0], Outcome::default(), "an ended episode ignores its action");
        assert_eq!(o[1], Outcome { reward: 0.0, done: true }, "the step limit of 3 ends the other");
        assert_eq!(
            ended,
            vec![EpisodeStats { ret: 0.0, length: 3, success: false, rooms: 0, informed: 0, recalled: 0 }]
        );
        assert!(e.all_done());
        assert!(e.observe(FIXED_WORDS).iter().all(|&v| v == 0.0), "ended episodes read as zeros");
    }

    #[test]
    fn refill_starts_the_next_episode_only_where_one_has_ended() {
        let cfg = corridor_config(2, 2, 3);
        let mut e = Episodes::new(&cfg, 3, 1).unwrap();
        assert_eq!(e.numbers(), vec![0, 1, 2]);
        // Slot 1 reaches the step limit first: it alone ends.
        e.slots[1].length = 2;
        let (o, _) = e.step(&[Action::Left; 3]);
        assert_eq!(o.iter().map(|o| o.done).collect::<Vec<_>>(), vec![false, true, false]);
        let kept = [e.slots[0].clone(), e.slots[2].clone()];
        e.refill(&cfg).unwrap();
        assert_eq!(e.numbers(), vec![0, 3, 2], "row 1 plays episode 3, the next of the streams");
        assert_eq!([e.slots[0].clone(), e.slots[2].clone()], kept, "running episodes are untouched");
        let fresh = &e.slots[1];
        assert!(!fresh.done && fresh.length == 0 && fresh.ret == 0.0);
        assert_eq!(fresh.world, World::new(&cfg, &mut Rng::derive(1, 3)).unwrap(), "drawn from its own stream");
        assert!(!e.all_done());
    }
}
