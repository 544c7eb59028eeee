//! Object collision (Expire-Span paper, section 5.3 and A.3.3; docs/design/algorithms.md, Tasks, after the
//! official `gen_data_collisions.py`): two particles move on a 16 x 16 grid and the model
//! must recall in which quadrant the last collision of a given colour pair happened.
//!
//! - Positions start uniform in the grid, velocities are Gaussian (speed 0.5 per axis);
//!   a particle whose next position would leave the grid re-draws its velocity instead
//!   of moving. Each step a particle re-draws its colour (5 colours) with probability 0.05.
//! - A collision is two particles on the same rasterised cell (`floor(x), floor(y)`);
//!   it does not affect the movement. Quadrant: `(x >= 8) + 2 (y >= 8)`.
//! - 8 tokens per step: for each particle `x`, `y + 16`, `colour + 32`, then the query
//!   pair `cp + 37`, `cq + 37`; 40% of queries ask about the pair of the most recent
//!   collision, the rest a uniform pair among the others. The answer is `quadrant + 1` of that pair's last
//!   collision, the target of the position after the query; 0 (no collision yet) is not
//!   scored. Chance error is 75%.
//! - Easy version (A.2): no colours (colour and query tokens are constant) and the
//!   question is the quadrant of the last collision.
//!
//! An episode is one simulation of `steps` steps followed by the separator token 47,
//! which marks a fresh grid and carries the last step's answer as its target.

use crate::seq::TokenSeq;
use lethe_core::config::{CollisionConfig, DataConfig};
use lethe_core::rng::Rng;

use super::Generator;
use crate::task::spec::{Metric, Task};

/// Side of the grid in cells.
pub const GRID: usize = 16;
/// Number of colours.
pub const COLOURS: usize = 5;
/// Token between simulations.
pub const SEPARATOR: u8 = 47;
/// Tokens per simulation step.
pub const TOKENS_PER_STEP: usize = 8;

/// What happened at one step, for checking the generator.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRecord {
    /// Rasterised cell of each particle.
    pub cells: [(u8, u8); 2],
    /// Colour of each particle.
    pub colours: [u8; 2],
    /// The particles share a cell.
    pub collided: bool,
    /// The queried colour pair.
    pub query: (u8, u8),
    /// The query is the pair of the most recent collision.
    pub about_last: bool,
    /// `quadrant + 1` of the queried pair's last collision; 0 when there was none.
    pub label: u8,
}

#[derive(Clone, Debug)]
struct Particle {
    x: f64,
    y: f64,
    vx: f64,
    vy: f64,
    colour: u8,
}

impl Particle {
    fn new(rng: &mut Rng, cfg: &CollisionConfig) -> Self {
        let colour = if cfg.easy { 0 } else { rng.range(0, COLOURS - 1) as u8 };
        let g = GRID as f64;
        Particle {
            x: rng.uniform() * g,
            y: rng.uniform() * g,
            vx: gaussian(rng) * cfg.speed,
            vy: gaussian(rng) * cfg.speed,
            colour,
        }
    }

    fn cell(&self) -> (u8, u8) {
        let c = |v: f64| (v.floor().max(0.0) as usize).min(GRID - 1) as u8;
        (c(self.x), c(self.y))
    }

    /// Moves by the velocity, or re-draws the velocity when the move would leave the grid.
    fn advance(&mut self, rng: &mut Rng, cfg: &CollisionConfig) {
        let (nx, ny) = (self.x + self.vx, self.y + self.vy);
        let g = GRID as f64;
        if (0.0..g).contains(&nx) && (0.0..g).contains(&ny) {
            self.x = nx;
            self.y = ny;
        } else {
            self.vx = gaussian(rng) * cfg.speed;
            self.vy = gaussian(rng) * cfg.speed;
        }
        if !cfg.easy && rng.uniform() < cfg.recolour {
            self.colour = rng.range(0, COLOURS - 1) as u8;
        }
    }
}

/// A standard normal draw (Box-Muller).
fn gaussian(rng: &mut Rng) -> f64 {
    let u1 = rng.uniform().max(1e-300);
    let u2 = rng.uniform();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

fn quadrant(cell: (u8, u8)) -> u8 {
    (cell.0 >= GRID as u8 / 2) as u8 + 2 * (cell.1 >= GRID as u8 / 2) as u8
}

fn pair(a: u8, b: u8) -> (u8, u8) {
    (a.min(b), a.max(b))
}

/// A uniform colour pair other than `avoid`, so that exactly `match_share` of the
/// queries are about the most recent collision.
fn other_pair(rng: &mut Rng, avoid: Option<(u8, u8)>) -> (u8, u8) {
    loop {
        let q = (rng.range(0, COLOURS - 1) as u8, rng.range(0, COLOURS - 1) as u8);
        if avoid != Some(pair(q.0, q.1)) {
            return q;
        }
    }
}

/// Simulates `steps` steps of one episode.
pub fn simulate(cfg: &CollisionConfig, rng: &mut Rng, steps: usize) -> Vec<StepRecord> {
    let mut particles = [Particle::new(rng, cfg), Particle::new(rng, cfg)];
    let mut last_by_pair = [[0u8; COLOURS]; COLOURS]; // quadrant + 1, 0 = none
    let mut last_pair: Option<(u8, u8)> = None;
    let mut out = Vec::with_capacity(steps);
    for _ in 0..steps {
        for p in &mut particles {
            p.advance(rng, cfg);
        }
        let cells = [particles[0].cell(), particles[1].cell()];
        let colours = [particles[0].colour, particles[1].colour];
        let collided = cells[0] == cells[1];
        if collided {
            let key = pair(colours[0], colours[1]);
            last_by_pair[key.0 as usize][key.1 as usize] = quadrant(cells[0]) + 1;
            last_pair = Some(key);
        }
        let (query, about_last) = match last_pair {
            _ if cfg.easy => ((0, 0), last_pair.is_some()),
            Some(p) if rng.uniform() < cfg.match_share => (p, true),
            _ => (other_pair(rng, last_pair), false),
        };
        let key = pair(query.0, query.1);
        let label = last_by_pair[key.0 as usize][key.1 as usize];
        out.push(StepRecord { cells, colours, collided, query, about_last, label });
    }
    out
}

/// The collision task.
#[derive(Clone, Debug)]
pub struct CollisionTask {
    cfg: CollisionConfig,
}

impl CollisionTask {
    /// The task with `cfg`'s settings.
    pub fn new(cfg: &CollisionConfig) -> Self {
        CollisionTask { cfg: cfg.clone() }
    }
}

/// Tokens of a simulated episode: 8 per step, then the separator; each step's answer is
/// the target of the position after its last token.
pub fn tokens_of(records: &[StepRecord], easy: bool) -> TokenSeq {
    let n = records.len() * TOKENS_PER_STEP + 1;
    let mut tokens = Vec::with_capacity(n);
    for r in records {
        for (&(x, y), &c) in r.cells.iter().zip(&r.colours) {
            tokens.extend([x, y + 16, if easy { 32 } else { c + 32 }]);
        }
        let (cp, cq) = if easy { (0, 0) } else { r.query };
        tokens.extend([cp + 37, cq + 37]);
    }
    tokens.push(SEPARATOR);
    let mut labels = tokens.clone();
    let mut scored = vec![false; n];
    for (s, r) in records.iter().enumerate() {
        let after_query = (s + 1) * TOKENS_PER_STEP;
        labels[after_query] = r.label;
        scored[after_query] = r.label > 0;
    }
    TokenSeq::bytes(&tokens, Some(scored), Some(&labels))
}

impl Generator for CollisionTask {
    fn episode(&self, rng: &mut Rng) -> TokenSeq {
        tokens_of(&simulate(&self.cfg, rng, self.cfg.steps), self.cfg.easy)
    }

    fn longest_episode(&self) -> (u64, &'static str) {
        ((self.cfg.steps as u64).saturating_mul(TOKENS_PER_STEP as u64).saturating_add(1), "data.collision.steps")
    }
}

/// The collision task in the registry ([`crate::task::of`]).
pub struct CollisionSpec;

impl Task for CollisionSpec {
    fn name(&self) -> &'static str {
        "collision"
    }

    fn describe(&self, d: &DataConfig) -> String {
        let k = &d.collision;
        format!(
            "object collision ({}), {} steps of 8 tokens per simulation; chance error 75%",
            if k.easy { "easy" } else { "hard" },
            k.steps
        )
    }

    fn metric(&self) -> Metric {
        Metric::Error
    }

    /// The simulation steps per episode.
    fn set_length(&self, d: &mut DataConfig, n: usize) -> bool {
        d.collision.steps = n;
        true
    }

    fn generator(&self, d: &DataConfig) -> Option<(Box<dyn Generator>, usize)> {
        Some((Box::new(CollisionTask::new(&d.collision)), d.collision.eval_tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collisions_are_shared_cells_and_labels_replay_the_history() {
        let cfg = CollisionConfig::default();
        let records = simulate(&cfg, &mut Rng::new(5), 50_000);
        let mut last = [[0u8; COLOURS]; COLOURS];
        let mut collisions = 0;
        for r in &records {
            assert_eq!(r.collided, r.cells[0] == r.cells[1]);
            assert!(r.cells.iter().all(|&(x, y)| (x as usize) < GRID && (y as usize) < GRID));
            if r.collided {
                collisions += 1;
                let k = pair(r.colours[0], r.colours[1]);
                last[k.0 as usize][k.1 as usize] = quadrant(r.cells[0]) + 1;
            }
            let k = pair(r.query.0, r.query.1);
            assert_eq!(r.label, last[k.0 as usize][k.1 as usize]);
        }
        assert!(collisions > 50, "only {collisions} collisions in 50k steps");
        // Colours change now and then, but not at every step.
        let changes = records.windows(2).filter(|w| w[0].colours[0] != w[1].colours[0]).count();
        let rate = changes as f64 / records.len() as f64;
        assert!(rate > 0.02 && rate < 0.06, "recolour rate {rate} (0.05 * 4/5 expected)");
    }

    #[test]
    fn forty_percent_of_queries_ask_about_the_last_collision() {
        let cfg = CollisionConfig::default();
        let records = simulate(&cfg, &mut Rng::new(9), 200_000);
        let after_first: Vec<&StepRecord> = records.iter().skip_while(|r| !r.collided).collect();
        let about = after_first.iter().filter(|r| r.about_last).count() as f64 / after_first.len() as f64;
        assert!((about - 0.4).abs() < 0.01, "share {about}");
    }

    #[test]
    fn tokens_put_each_answer_after_its_query() {
        let cfg = CollisionConfig { steps: 3, ..CollisionConfig::default() };
        let records = simulate(&cfg, &mut Rng::new(1), 400);
        let seq = tokens_of(&records, false);
        assert_eq!(seq.len(), 400 * 8 + 1);
        let bytes = crate::bytes_of(&seq.tokens);
        assert_eq!(bytes[seq.len() - 1], SEPARATOR);
        for (s, r) in records.iter().enumerate() {
            let base = s * 8;
            assert_eq!(bytes[base], r.cells[0].0);
            assert_eq!(bytes[base + 4], r.cells[1].1 + 16);
            assert_eq!(bytes[base + 6], r.query.0 + 37);
            assert_eq!(seq.target(base + 8), u32::from(r.label));
            assert_eq!(seq.is_scored(base + 8), r.label > 0);
        }
        let scored = (0..seq.len()).filter(|&i| seq.is_scored(i)).count();
        assert_eq!(scored, records.iter().filter(|r| r.label > 0).count());
    }

    #[test]
    fn the_easy_version_asks_for_the_last_collision_without_colours() {
        let cfg = CollisionConfig { easy: true, ..CollisionConfig::default() };
        let records = simulate(&cfg, &mut Rng::new(2), 20_000);
        let mut last = 0;
        for r in &records {
            assert_eq!(r.colours, [0, 0]);
            if r.collided {
                last = quadrant(r.cells[0]) + 1;
            }
            assert_eq!(r.label, last);
        }
        let seq = tokens_of(&records, true);
        assert!(seq.tokens.chunks(8).take(100).all(|c| c[2] == 32 && c[6] == 37 && c[7] == 37));
    }
}
