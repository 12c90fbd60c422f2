//! Caudal benchmarks: criterion micro-benchmarks (`benches/`) and end-to-end runners
//! (`src/bin/`), plus what the runners share.

pub mod big_state;

/// User + system CPU seconds of this process (from /proc, clock ticks of 10 ms).
pub fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields after the command: state is index 0; utime is field 14 overall → index 11.
    (ticks(11) + ticks(12)) / 100.0
}
