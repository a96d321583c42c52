//! Where the cores went while a throughput figure was measured: the
//! benchmark process's own CPU time (the harness and the tasks driving it)
//! and the whole machine's, read from /proc (Linux), so a figure can say
//! whether it was bound by the cores or by waiting.

/// CPU counters at one moment.
pub struct CpuMark {
    /// This process's user and system time, in clock ticks.
    process: u64,
    /// The machine's busy and total time over all cores, in clock ticks.
    busy: u64,
    total: u64,
    cores: usize,
}

/// Cores in use on average between two marks.
pub struct CpuUse {
    pub process_cores: f64,
    pub machine_busy_cores: f64,
}

impl CpuMark {
    /// `None` where /proc cannot be read (not Linux).
    pub fn now() -> Option<CpuMark> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name, which may hold spaces: the 12th
        // and 13th of those are utime and stime.
        let mut after = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
        let process = after.next()?.parse::<u64>().ok()? + after.next()?.parse::<u64>().ok()?;
        let machine = std::fs::read_to_string("/proc/stat").ok()?;
        let total_line = machine.lines().next()?.strip_prefix("cpu ")?;
        let ticks: Vec<u64> = total_line
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal (guest time is
        // already counted in user).
        let total: u64 = ticks.iter().take(8).sum();
        let idle = ticks.get(3)? + ticks.get(4).copied().unwrap_or(0);
        let cores = machine
            .lines()
            .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
            .count();
        Some(CpuMark {
            process,
            busy: total - idle,
            total,
            cores,
        })
    }

    /// The average use since this mark; `None` when too little time passed
    /// to tell.
    pub fn since(&self) -> Option<CpuUse> {
        let now = CpuMark::now()?;
        let elapsed_total = now.total.checked_sub(self.total)?;
        if elapsed_total == 0 || self.cores == 0 {
            return None;
        }
        // Ticks of one core over the interval.
        let per_core = elapsed_total as f64 / self.cores as f64;
        Some(CpuUse {
            process_cores: now.process.saturating_sub(self.process) as f64 / per_core,
            machine_busy_cores: now.busy.saturating_sub(self.busy) as f64 / per_core,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_loop_counts_as_this_processs_cpu_and_the_machines() {
        let Some(mark) = CpuMark::now() else {
            return;
        };
        // Spin until the process has used CPU, not for a length of time: on
        // a loaded machine the loop may get a small share of a core.
        let started = std::time::Instant::now();
        let mut x = 0u64;
        let used = loop {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            let used = mark.since().expect("time passed");
            if used.process_cores > 0.0 && started.elapsed() > std::time::Duration::from_millis(300)
                || started.elapsed() > std::time::Duration::from_secs(20)
            {
                break used;
            }
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(used.process_cores > 0.0, "the loop's CPU was not counted");
        assert!(
            used.process_cores <= cores as f64 + 0.2,
            "{}",
            used.process_cores
        );
        // What this process used, the machine was busy with.
        assert!(
            used.machine_busy_cores >= used.process_cores * 0.8,
            "{} < {}",
            used.machine_busy_cores,
            used.process_cores
        );
    }
}
