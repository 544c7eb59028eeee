//! Helpers shared by the integration tests.
#![allow(dead_code)]

use lethe::config::{Config, CopyConfig};

/// A model and task small enough to train in a second or two on 2 cores.
pub fn tiny_config() -> Config {
    let mut c = Config::preset("copy-tiny").unwrap();
    c.name = "tiny".into();
    c.model.layers = 1;
    c.model.d_model = 16;
    c.model.heads = 2;
    c.model.d_ffn = 32;
    c.memory.span = 16;
    c.train.batch = 4;
    c.train.block = 8;
    c.train.steps = 6;
    c.train.warmup = 2;
    c.train.log_every = 2;
    c.train.eval_every = 0;
    c.train.eval_tokens = 256;
    c.train.checkpoint_every = 0;
    c.data.copy = CopyConfig { count_min: 1, count_max: 3, distance_min: 4, distance_max: 8, eval_tokens: 256 };
    c
}

/// libtorch's random generator (initialisation, dropout) is global to the process, and
/// the test harness runs tests on parallel threads. Tests that need reproducible numbers
/// hold this lock so that no other test reseeds or draws from it meanwhile.
pub fn torch_rng_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
