//! Benchmarks of every memory mechanism at the `enwik8-tiny` size: one layer's attention
//! (forward and backward, memory full) and one full training step (forward, backward,
//! clip, Adam), each timed over 40 iterations after a warm-up.
//!
//! ```text
//! cargo bench --bench mechanisms                       # run, compare with the baseline
//! cargo bench --bench mechanisms -- --save-baseline    # run and make it the baseline
//! cargo bench --bench mechanisms -- infinity           # only names containing `infinity`
//! ```
//!
//! The baseline is `target/lethe-bench-baseline.json`; each run prints the change of
//! every median against it, so a regression shows as a positive percentage. A plain
//! harness (no criterion): lethe's own `bench` module does the timing.

use std::collections::BTreeMap;
use std::path::Path;

use lethe::bench::{bench, time_attention, BenchOptions};
use lethe::config::{Config, Mechanism};
use lethe::sweep::configure;

const MECHANISMS: [(Mechanism, usize); 5] = [
    (Mechanism::Fixed, 256),
    (Mechanism::Adaptive, 1024),
    (Mechanism::Expire, 1024),
    (Mechanism::Compressive, 512),
    (Mechanism::Infinity, 512),
];
const BASELINE: &str = "target/lethe-bench-baseline.json";
const STEPS: usize = 40;
const WARMUP: usize = 3;

fn main() -> lethe::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let save = args.iter().any(|a| a == "--save-baseline");
    let filter = args.iter().find(|a| !a.starts_with("--")).cloned().unwrap_or_default();
    let base = Config::preset("enwik8-tiny")?;
    let baseline = read_baseline();
    let mut now = BTreeMap::new();
    println!("{:<24} {:>10} {:>18} {:>10}", "benchmark", "median ms", "p10-p90 ms", "vs base");
    for (mechanism, size) in MECHANISMS {
        let name = mechanism.name();
        let cfg = configure(&base, mechanism, size, base.seed)?;
        for (what, run) in [("attention", true), ("step", false)] {
            let id = format!("{what}/{name}-{size}");
            if !id.contains(&filter) {
                continue;
            }
            let t = if run {
                time_attention(&cfg, STEPS, WARMUP)?
            } else {
                bench(
                    &cfg,
                    &BenchOptions {
                        steps: STEPS,
                        rounds: 1,
                        warmup: WARMUP,
                        context: None,
                        profile: false,
                        trace: None,
                        ..Default::default()
                    },
                    None,
                )?
                .timing()
            };
            let change = baseline
                .get(&id)
                .map(|b| format!("{:+.1}%", 100.0 * (t.median_s / b - 1.0)))
                .unwrap_or_else(|| "-".into());
            println!(
                "{id:<24} {:>10.2} {:>18} {change:>10}",
                1e3 * t.median_s,
                format!("{:.2}-{:.2}", 1e3 * t.p10_s, 1e3 * t.p90_s)
            );
            now.insert(id, t.median_s);
        }
    }
    if save {
        let mut all = baseline;
        all.extend(now);
        let text =
            serde_json::to_string_pretty(&all).map_err(|e| lethe::LetheError::Invalid(format!("baseline: {e}")))?;
        lethe::checkpoint::write_atomic(Path::new(BASELINE), text.as_bytes())?;
        println!("saved the baseline to {BASELINE}");
    }
    Ok(())
}

/// The saved medians by benchmark name (empty when there is no baseline yet).
fn read_baseline() -> BTreeMap<String, f64> {
    std::fs::read_to_string(BASELINE).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default()
}
