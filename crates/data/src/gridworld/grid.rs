//! The gridworlds' vocabulary, shared by the corridor, the portal and the batch of
//! episodes (Expire-Span paper, A.3.1; MazeBase, Sukhbaatar et al., 2015): every object
//! and property is a word ("agent", "block", "door", "red", ...), the four moves, the
//! colours, and what one step did.

use serde::{Deserialize, Serialize};

use lethe_core::rng::Rng;

/// Side of the square the agent sees, centred on itself.
pub const VIEW: usize = 3;

/// The most columns, and rows, that a map's text shows: a larger map (a corridor of a
/// million cells) is shown as the window of this many cells around the agent, so that
/// printing a step stays short.
pub const SHOWN: i64 = 400;

/// The cells of `0..extent` on one axis that a map's text shows: all of them, or the
/// [`SHOWN`] around `centre` when there are more.
pub fn shown(extent: i64, centre: i64) -> std::ops::Range<i64> {
    if extent <= SHOWN {
        return 0..extent;
    }
    let start = (centre - SHOWN / 2).clamp(0, extent - SHOWN);
    start..start + SHOWN
}

/// How a map's text says which part of an axis it shows: nothing for all of it, or
/// `columns 100-499 of 1002` (`axis` names the axis).
pub fn shown_part(axis: &str, range: &std::ops::Range<i64>, extent: i64) -> Option<String> {
    (range.end - range.start < extent).then(|| format!("{axis} {}-{} of {extent}", range.start, range.end - 1))
}

/// The four moves, in the order of the policy's outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    /// `y - 1`.
    Up,
    /// `y + 1`.
    Down,
    /// `x - 1`.
    Left,
    /// `x + 1`.
    Right,
}

impl Action {
    /// Number of actions.
    pub const COUNT: usize = 4;
    /// All actions, by index.
    pub const ALL: [Action; 4] = [Action::Up, Action::Down, Action::Left, Action::Right];

    /// The action of policy output `i` (`i < 4`).
    pub fn from_index(i: usize) -> Action {
        Action::ALL[i % Self::COUNT]
    }

    /// The move `(dx, dy)`.
    pub fn delta(self) -> (i64, i64) {
        match self {
            Action::Up => (0, -1),
            Action::Down => (0, 1),
            Action::Left => (-1, 0),
            Action::Right => (1, 0),
        }
    }

    /// The action's name, as `lethe play` prints it.
    pub fn name(self) -> &'static str {
        match self {
            Action::Up => "up",
            Action::Down => "down",
            Action::Left => "left",
            Action::Right => "right",
        }
    }

    /// A one-letter name for renderings.
    pub fn letter(self) -> char {
        match self {
            Action::Up => 'U',
            Action::Down => 'D',
            Action::Left => 'L',
            Action::Right => 'R',
        }
    }
}

/// A door or object colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Colour {
    /// Red.
    Red,
    /// Blue.
    Blue,
}

impl Colour {
    /// A fair draw.
    pub fn draw(rng: &mut Rng) -> Colour {
        if rng.next_u64() & 1 == 0 {
            Colour::Red
        } else {
            Colour::Blue
        }
    }

    /// The other colour.
    pub fn other(self) -> Colour {
        match self {
            Colour::Red => Colour::Blue,
            Colour::Blue => Colour::Red,
        }
    }

    /// Its word.
    pub fn word(self) -> Word {
        match self {
            Colour::Red => Word::Red,
            Colour::Blue => Word::Blue,
        }
    }
}

/// The words of the gridworlds. The portal task adds one word per room number
/// ([`Word::Room`]), after the fixed ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Word {
    /// The agent itself (the centre of every view).
    Agent,
    /// A wall; also everything outside the map.
    Block,
    /// A door (with its colour).
    Door,
    /// The corridor's coloured object (with its colour).
    Object,
    /// Red.
    Red,
    /// Blue.
    Blue,
    /// "room k" (1-based), on the agent's cell in the portal task.
    Room(usize),
}

/// Number of fixed words (before the room numbers).
pub const FIXED_WORDS: usize = 6;

impl Word {
    /// Index in the observation's word axis.
    pub fn index(self) -> usize {
        match self {
            Word::Agent => 0,
            Word::Block => 1,
            Word::Door => 2,
            Word::Object => 3,
            Word::Red => 4,
            Word::Blue => 5,
            Word::Room(k) => FIXED_WORDS + k - 1,
        }
    }
}

/// What one step did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Reward of the step.
    pub reward: f64,
    /// Whether the episode ended with this step.
    pub done: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_axis_is_shown_around_the_centre_within_its_ends() {
        assert_eq!(shown(10, 3), 0..10);
        assert_eq!(shown(SHOWN, 0), 0..SHOWN);
        assert_eq!(shown(10_000, 5_000), 4_800..5_200);
        assert_eq!(shown(10_000, 3), 0..SHOWN);
        assert_eq!(shown(10_000, 9_999), 10_000 - SHOWN..10_000);
        assert_eq!(shown_part("columns", &(0..10), 10), None);
        assert_eq!(shown_part("rows", &(4_800..5_200), 10_000).as_deref(), Some("rows 4800-5199 of 10000"));
    }
}
