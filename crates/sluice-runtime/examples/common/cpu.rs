//! The CPU time of the benchmark's own process, shared by this crate's examples.

/// `/proc/self/stat` counts CPU time in clock ticks; 100 per second on the Linux we run on.
const CLOCK_TICKS_PER_SEC: f64 = 100.0;

/// User + system CPU time of the whole process (every thread: workers, writers, the
/// runtime's own tasks), in seconds, from `/proc/self/stat`; 0 where there is no procfs.
pub fn process_cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name (which may hold spaces); utime and stime
    // are fields 14 and 15, the 12th and 13th after it.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |index: usize| fields.get(index).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    (ticks(11) + ticks(12)) as f64 / CLOCK_TICKS_PER_SEC
}
