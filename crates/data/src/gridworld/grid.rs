//! The gridworlds' vocabulary, shared by the corridor, the portal and the batch of
//! episodes (Expire-Span paper, A.3.1; MazeBase, Sukhbaatar et al., 2015): every object
//! and property is a word ("agent", "block", "door", "red", ...), the four moves, the
//! colours, and what one step did.

use serde::{Deserialize, Serialize};

use lethe_core::rng::Rng;

/// Side of the square the agent sees, centred on itself.
pub const VIEW: usize = 3;

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
