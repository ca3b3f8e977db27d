//! Whether busy polling pays right now, and the spin loop that asks.
//!
//! Spinning on a socket for an awaited answer saves the wake-up the answer otherwise costs, but
//! only while the host has a core to spare: once runnable threads outnumber cores, a spinner
//! takes the core the server and the other processes need, and everyone gets slower (several
//! client processes on two cores lost 2-3× in calls/s and p99 to spinning; docs/decisions.md).
//! So in the adaptive mode every spin first asks for a [`Verdict`], from two inputs:
//!
//! * the host's load, read at most every [`HOST_SAMPLE_EVERY`] by one thread of the process and
//!   smoothed: how many other threads are runnable, on average (the kernel's count of runnable
//!   threads in `/proc/loadavg`, the reading thread left out), against the cores the process may
//!   use, and how much of the time some thread had to wait for a core (the kernel's CPU pressure
//!   stall information, `/proc/pressure/cpu`, where it has it). A spinner takes one core and
//!   leaves the others; it polls while fewer than `cores - 1` other threads want them, so one
//!   stays for whoever answers, or while no thread waits for a core at all. The count alone is
//!   a snapshot taken at the start of a call, just after the answering side sent its previous
//!   answer and while it is often still running: a lone client next to its server saw one other
//!   runnable thread at a third of its calls and did not spin for them, although the server had
//!   a core of its own. The stall time says what the count cannot: whether anyone actually
//!   waited.
//! * how spinning went on this thread lately ([`Governor`]): a spin during which the thread lost
//!   its core (a gap of [`DESCHEDULED_GAP`] between two looks at the socket) is a strike that
//!   outweighs eight answered spins; a spin whose budget ran out without an answer outweighs two
//!   (a responder that often needs longer than the budget makes spinning a waste; one that
//!   sometimes does, as a woken idle core on a virtual machine, not). Enough debt makes the
//!   thread stop polling for a while, longer each time: 1 ms and one call, doubling to 64 ms
//!   and 64 calls (both must pass, so a pause holds however slowly calls come); a run of
//!   answered spins that kept their core shortens the next pause again.
//!
//! Both are pure functions of their inputs ([`Governor::verdict`], [`Governor::record`],
//! [`host_has_spare_core`]); the tests drive each condition. [`PollPolicy::Always`] skips the
//! verdict (an explicit budget from the user); [`PollPolicy::AdaptiveWith`] replaces the kernel's
//! reading with a given one.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How a busy-polling side decides whether to spin for an answer.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum PollPolicy {
    /// Spin while the host has a core to spare and spinning has been paying on this thread
    /// (see the module documentation). The default.
    #[default]
    Adaptive,
    /// Spin on every wait, whatever the host's load (a budget the user asked for).
    Always,
    /// As `Adaptive`, with this reading of the host instead of the kernel's: for tests, and for
    /// hosts whose `/proc/loadavg` does not describe the cores the process may use.
    AdaptiveWith(HostLoad),
}

/// A reading of the host's load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostLoad {
    /// Runnable threads besides the one asking, on average.
    pub others_runnable: f64,
    /// Cores the host has.
    pub cores: u32,
    /// The share of the recent past during which some thread was runnable but waiting for a
    /// core; `None` where the kernel does not tell.
    pub waiting_for_cpu: Option<f64>,
}

/// A share of time waiting for a core under which the host counts as having a core to spare
/// whatever its runnable count (a stray wake-up of a kernel or idle thread; a spinner that
/// takes a core somebody needs makes the share jump to tens of percent).
pub const NOBODY_WAITS: f64 = 0.02;

/// Whether a thread that spins (and so keeps one core busy) still leaves a core for everyone
/// else that wants one, the answering side included: fewer other runnable threads than the
/// cores it leaves, or no thread waiting for a core lately.
pub fn host_has_spare_core(load: HostLoad) -> bool {
    load.cores >= 2
        && (load.others_runnable < f64::from(load.cores - 1)
            || load
                .waiting_for_cpu
                .is_some_and(|share| share < NOBODY_WAITS))
}

/// Whether to spin now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Poll,
    /// Other threads want every core a spinner would leave them.
    HostBusy,
    /// Spinning went badly on this thread lately: it waits until its pause is over.
    BackingOff,
}

/// How one spin went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spin {
    /// The awaited data came within the budget.
    pub answered: bool,
    /// The longest time between two consecutive looks at the socket.
    pub longest_gap: Duration,
}

/// A look at the socket this long after the previous one means the thread was not running in
/// between (a loop round is a non-blocking `recv`, a few µs; a preempted thread waits for a
/// whole time slice of another, or at least that thread's run).
pub const DESCHEDULED_GAP: Duration = Duration::from_micros(25);
/// What a spin that lost its core adds to the debt; an answered one takes one off.
const STRIKE: u32 = 8;
/// What a spin whose budget ran out adds (the debt grows while more than a third do).
const EXPIRED: u32 = 2;
/// Debt at which the thread pauses polling (two strikes in a row, or one in nine spins and more;
/// eight expired spins in a row, or more than a third of them).
const PAUSE_AT: u32 = 16;
/// The first pause; each further one (before a run of clean spins) doubles, up to the last.
const FIRST_PAUSE: Duration = Duration::from_millis(1);
const MAX_PAUSE_LEVEL: u32 = 7;
/// Answered spins in a row that kept their core after which the next pause is one step shorter.
const FORGIVE_AFTER: u32 = 32;

/// One thread's record of how spinning went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Governor {
    /// No spinning before this time (`now_ns`)...
    quiet_until_ns: u64,
    /// ... nor before this many more verdicts were asked ([`Governor::ask`]).
    quiet_calls: u32,
    /// How many pauses in a row (the next lasts `FIRST_PAUSE << level`).
    level: u32,
    debt: u32,
    clean_run: u32,
}

impl Governor {
    /// Whether to spin at `now_ns`, given the host's load (`None`: unknown).
    pub fn verdict(&self, now_ns: u64, host: Option<HostLoad>) -> Verdict {
        if host.is_some_and(|load| !host_has_spare_core(load)) {
            Verdict::HostBusy
        } else if now_ns < self.quiet_until_ns || self.quiet_calls > 0 {
            Verdict::BackingOff
        } else {
            Verdict::Poll
        }
    }

    /// [`Governor::verdict`] for a caller about to wait: a verdict of backing off counts one
    /// of the pause's calls.
    pub fn ask(&mut self, now_ns: u64, host: Option<HostLoad>) -> Verdict {
        let verdict = self.verdict(now_ns, host);
        if verdict == Verdict::BackingOff {
            self.quiet_calls = self.quiet_calls.saturating_sub(1);
        }
        verdict
    }

    /// Takes note of a spin that ended at `now_ns`.
    pub fn record(&mut self, now_ns: u64, spin: Spin) {
        if spin.longest_gap >= DESCHEDULED_GAP {
            self.debt += STRIKE;
            self.clean_run = 0;
        } else if spin.answered {
            self.debt = self.debt.saturating_sub(1);
            self.clean_run += 1;
        } else {
            // An expired spin neither strikes nor pays: it keeps a run of paying ones going
            // without adding to it.
            self.debt += EXPIRED;
        }
        if self.debt >= PAUSE_AT {
            let pause = FIRST_PAUSE * (1 << self.level);
            self.quiet_until_ns = now_ns.saturating_add(pause.as_nanos() as u64);
            self.quiet_calls = 1 << self.level;
            self.level = (self.level + 1).min(MAX_PAUSE_LEVEL - 1);
            self.debt = 0;
        } else if self.clean_run >= FORGIVE_AFTER {
            self.level = self.level.saturating_sub(1);
            self.clean_run = 0;
        }
    }

    /// How long the next pause would last.
    pub fn next_pause(&self) -> Duration {
        FIRST_PAUSE * (1 << self.level)
    }
}

thread_local! {
    static GOVERNOR: Cell<Governor> = Cell::new(Governor::default());
}

/// The verdict for the calling thread under `policy`.
pub(crate) fn decide(policy: PollPolicy) -> Verdict {
    let now = now_ns();
    let host = match policy {
        PollPolicy::Always => return Verdict::Poll,
        PollPolicy::Adaptive => host_load(now),
        PollPolicy::AdaptiveWith(load) => Some(load),
    };
    GOVERNOR.with(|g| {
        let mut governor = g.get();
        let verdict = governor.ask(now, host);
        g.set(governor);
        verdict
    })
}

/// Records how a spin of the calling thread went (not under `Always`, which never asks).
pub(crate) fn report(policy: PollPolicy, spin: Spin) {
    if policy != PollPolicy::Always {
        let now = now_ns();
        GOVERNOR.with(|g| {
            let mut governor = g.get();
            governor.record(now, spin);
            g.set(governor);
        });
    }
}

/// Times a spin loop: how long it has run and the longest gap between two rounds.
pub(crate) struct SpinClock {
    started: Instant,
    last: Instant,
    longest_gap: Duration,
}

impl SpinClock {
    pub(crate) fn start() -> Self {
        let now = Instant::now();
        SpinClock {
            started: now,
            last: now,
            longest_gap: Duration::ZERO,
        }
    }

    /// Marks a round; returns the time since the start.
    pub(crate) fn tick(&mut self) -> Duration {
        let now = Instant::now();
        self.longest_gap = self.longest_gap.max(now - self.last);
        self.last = now;
        now - self.started
    }

    pub(crate) fn finish(mut self, answered: bool) -> Spin {
        self.tick();
        Spin {
            answered,
            longest_gap: self.longest_gap,
        }
    }
}

/// Spins for up to `budget` calling `attempt` until it yields a value; `None` when the budget ran
/// out. Each failed attempt yields to the runtime, so other tasks of the same thread keep running
/// while we poll. Asks nothing and records nothing: see [`spin_governed`].
pub(crate) async fn spin<T>(
    budget: Duration,
    mut attempt: impl FnMut() -> Option<T>,
) -> (Option<T>, Spin) {
    let mut clock = SpinClock::start();
    loop {
        if let Some(value) = attempt() {
            return (Some(value), clock.finish(true));
        }
        if clock.tick() >= budget {
            return (None, clock.finish(false));
        }
        tokio::task::yield_now().await;
    }
}

/// [`spin`] when the verdict under `policy` is to poll (and taking note of how it went); `None`
/// at once otherwise.
pub(crate) async fn spin_governed<T>(
    policy: PollPolicy,
    budget: Duration,
    attempt: impl FnMut() -> Option<T>,
) -> Option<T> {
    if decide(policy) != Verdict::Poll {
        return None;
    }
    let (value, spin) = spin(budget, attempt).await;
    report(policy, spin);
    value
}

/// How often the process reads the host's runnable count at most.
pub const HOST_SAMPLE_EVERY: Duration = Duration::from_millis(2);

/// The host's load as last sampled (at most every [`HOST_SAMPLE_EVERY`], by whichever thread
/// asks first once it is due); `None` where the kernel does not tell.
fn host_load(now_ns: u64) -> Option<HostLoad> {
    static NEXT_SAMPLE_NS: AtomicU64 = AtomicU64::new(0);
    /// Smoothed others-runnable count in thousandths; `u64::MAX` before the first reading.
    static OTHERS_MILLI: AtomicU64 = AtomicU64::new(u64::MAX);
    /// Smoothed share of time some thread waited for a core, in millionths; `u64::MAX` before
    /// the first share (two readings).
    static WAITING_PPM: AtomicU64 = AtomicU64::new(u64::MAX);
    /// The kernel's total stall time (µs) and `now_ns` at the previous reading; `u64::MAX`
    /// before it.
    static STALL_TOTAL_US: AtomicU64 = AtomicU64::new(u64::MAX);
    static STALL_READ_NS: AtomicU64 = AtomicU64::new(0);
    let due = NEXT_SAMPLE_NS.load(Ordering::Relaxed);
    if now_ns >= due
        && NEXT_SAMPLE_NS
            .compare_exchange(
                due,
                now_ns + HOST_SAMPLE_EVERY.as_nanos() as u64,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
    {
        if let Some(runnable) = read_runnable() {
            // The reading thread is running: it is not one of the others.
            let sample = u64::from(runnable.saturating_sub(1)) * 1000;
            let old = OTHERS_MILLI.load(Ordering::Relaxed);
            OTHERS_MILLI.store(smooth(old, sample), Ordering::Relaxed);
        }
        if let Some(total_us) = read_cpu_stall_us() {
            let previous_us = STALL_TOTAL_US.swap(total_us, Ordering::Relaxed);
            let previous_ns = STALL_READ_NS.swap(now_ns, Ordering::Relaxed);
            // A sampler that won its window and was then preempted can store its reading after
            // a later window's: that pair has no elapsed time (no share), and the next pair a
            // stall total that went back (no stall), one odd sample the smoothing absorbs.
            let elapsed_ns = now_ns.saturating_sub(previous_ns);
            if let Some(share) = waiting_share_ppm(previous_us, total_us, elapsed_ns) {
                let old = WAITING_PPM.load(Ordering::Relaxed);
                WAITING_PPM.store(smooth(old, share), Ordering::Relaxed);
            }
        }
    }
    let milli = OTHERS_MILLI.load(Ordering::Relaxed);
    let waiting = WAITING_PPM.load(Ordering::Relaxed);
    (milli != u64::MAX).then(|| HostLoad {
        others_runnable: milli as f64 / 1000.0,
        cores: host_cores(),
        waiting_for_cpu: (waiting != u64::MAX).then(|| waiting as f64 / 1e6),
    })
}

/// The share (millionths) of `elapsed_ns` during which some thread waited for a core, from two
/// readings of the kernel's total stall time; `None` without a previous reading (`u64::MAX`)
/// or elapsed time.
fn waiting_share_ppm(previous_us: u64, total_us: u64, elapsed_ns: u64) -> Option<u64> {
    if previous_us == u64::MAX || elapsed_ns == 0 {
        return None;
    }
    let stalled_ns = total_us.saturating_sub(previous_us).saturating_mul(1000);
    Some((stalled_ns.saturating_mul(1_000_000) / elapsed_ns).min(1_000_000))
}

/// The smoothed value after `sample` (a quarter of the way from `old`; `old == u64::MAX`: none
/// yet, the sample itself).
fn smooth(old: u64, sample: u64) -> u64 {
    if old == u64::MAX {
        sample
    } else if sample >= old {
        old + (sample - old) / 4
    } else {
        old - (old - sample) / 4
    }
}

/// The cores this process may use: the host's online cores, or fewer where its CPU affinity or
/// cgroup quota allow fewer (`available_parallelism`); 1 where unknown. Compared with the
/// host-wide runnable count this errs towards not spinning.
fn host_cores() -> u32 {
    static CORES: OnceLock<u32> = OnceLock::new();
    *CORES.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        let online = u32::try_from(online).ok().filter(|&n| n > 0).unwrap_or(1);
        let usable = std::thread::available_parallelism()
            .map_or(online, |n| u32::try_from(n.get()).unwrap_or(u32::MAX));
        online.min(usable)
    })
}

/// The kernel's count of runnable threads on the host, the reader included.
fn read_runnable() -> Option<u32> {
    use std::os::unix::fs::FileExt;
    static LOADAVG: OnceLock<Option<std::fs::File>> = OnceLock::new();
    let file = LOADAVG
        .get_or_init(|| std::fs::File::open("/proc/loadavg").ok())
        .as_ref()?;
    let mut buf = [0u8; 128];
    let n = file.read_at(&mut buf, 0).ok()?;
    parse_runnable(std::str::from_utf8(&buf[..n]).ok()?)
}

/// The kernel's total time (µs) during which some thread waited for a core
/// (`/proc/pressure/cpu`); `None` where the kernel has no pressure stall information.
fn read_cpu_stall_us() -> Option<u64> {
    use std::os::unix::fs::FileExt;
    static PRESSURE: OnceLock<Option<std::fs::File>> = OnceLock::new();
    let file = PRESSURE
        .get_or_init(|| std::fs::File::open("/proc/pressure/cpu").ok())
        .as_ref()?;
    let mut buf = [0u8; 256];
    let n = file.read_at(&mut buf, 0).ok()?;
    parse_stall_total(std::str::from_utf8(&buf[..n]).ok()?)
}

/// The `some` total of a `/proc/pressure/cpu` text ("some avg10=0.00 avg60=0.00 avg300=0.00
/// total=12345" and a `full` line: 12345).
pub fn parse_stall_total(text: &str) -> Option<u64> {
    text.lines()
        .find(|line| line.starts_with("some "))?
        .split_whitespace()
        .find_map(|field| field.strip_prefix("total="))?
        .parse()
        .ok()
}

/// The runnable count of a `/proc/loadavg` line ("0.52 0.58 0.59 3/612 12345": 3).
pub fn parse_runnable(line: &str) -> Option<u32> {
    line.split_whitespace()
        .nth(3)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// Nanoseconds since the first call of this function in the process (a cheap shared clock for
/// atomics).
pub(crate) fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const MS: u64 = 1_000_000;

    fn clean() -> Spin {
        Spin {
            answered: true,
            longest_gap: Duration::from_micros(3),
        }
    }

    fn descheduled() -> Spin {
        Spin {
            answered: true,
            longest_gap: DESCHEDULED_GAP,
        }
    }

    fn expired() -> Spin {
        Spin {
            answered: false,
            longest_gap: Duration::from_micros(3),
        }
    }

    fn load(others: f64, cores: u32) -> Option<HostLoad> {
        Some(HostLoad {
            others_runnable: others,
            cores,
            waiting_for_cpu: None,
        })
    }

    fn with_waiting(load: Option<HostLoad>, share: f64) -> HostLoad {
        HostLoad {
            waiting_for_cpu: Some(share),
            ..load.unwrap()
        }
    }

    #[test]
    fn a_spinner_needs_a_core_left_for_the_others() {
        assert!(host_has_spare_core(load(0.0, 2).unwrap()));
        assert!(host_has_spare_core(load(0.9, 2).unwrap()));
        assert!(!host_has_spare_core(load(1.0, 2).unwrap()));
        assert!(!host_has_spare_core(load(3.5, 2).unwrap()));
        // One core: a spinner always takes the responder's.
        assert!(!host_has_spare_core(load(0.0, 1).unwrap()));
        assert!(host_has_spare_core(load(14.0, 16).unwrap()));
        assert!(!host_has_spare_core(load(15.0, 16).unwrap()));
    }

    /// A lone client next to its server: the count often sees the server still running, but
    /// nobody waits for a core, so the client spins; once threads do wait, it does not.
    #[test]
    fn a_host_where_nobody_waits_for_a_core_has_one_to_spare() {
        assert!(host_has_spare_core(with_waiting(load(1.0, 2), 0.0)));
        assert!(host_has_spare_core(with_waiting(load(3.0, 2), 0.01)));
        assert!(!host_has_spare_core(with_waiting(
            load(1.0, 2),
            NOBODY_WAITS
        )));
        assert!(!host_has_spare_core(with_waiting(load(1.2, 2), 0.3)));
        // Few runnable threads are enough whatever the waiting says.
        assert!(host_has_spare_core(with_waiting(load(0.5, 2), 0.9)));
        // One core: never.
        assert!(!host_has_spare_core(with_waiting(load(0.0, 1), 0.0)));
    }

    #[test]
    fn the_waiting_share_comes_from_two_stall_totals() {
        // No previous reading, or no time passed: no share.
        assert_eq!(waiting_share_ppm(u64::MAX, 500, 2_000_000), None);
        assert_eq!(waiting_share_ppm(100, 500, 0), None);
        // 500 µs stalled in 2 ms: a quarter.
        assert_eq!(waiting_share_ppm(1_000, 1_500, 2_000_000), Some(250_000));
        assert_eq!(waiting_share_ppm(1_000, 1_000, 2_000_000), Some(0));
        // More stall than time passed (readings of two samplers interleaved): capped at all of it.
        assert_eq!(waiting_share_ppm(0, 5_000, 2_000_000), Some(1_000_000));
        // A total that went back (it never should) is no stall.
        assert_eq!(waiting_share_ppm(9_000, 1_000, 2_000_000), Some(0));
    }

    #[test]
    fn pressure_files_are_parsed() {
        let text = "some avg10=1.50 avg60=0.80 avg300=0.20 total=4748323684\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=17\n";
        assert_eq!(parse_stall_total(text), Some(4_748_323_684));
        assert_eq!(parse_stall_total("some avg10=0.00 total=0"), Some(0));
        assert_eq!(parse_stall_total("full avg10=0.00 total=17\n"), None);
        assert_eq!(parse_stall_total("some avg10=0.00"), None);
        assert_eq!(parse_stall_total("some total=x"), None);
        assert_eq!(parse_stall_total(""), None);
    }

    /// Where the kernel keeps pressure stall information, the total reads and never goes back.
    #[test]
    fn the_kernel_stall_total_reads_where_it_exists() {
        if std::path::Path::new("/proc/pressure/cpu").exists() {
            let first = read_cpu_stall_us().expect("stall total");
            let second = read_cpu_stall_us().expect("stall total");
            assert!(second >= first, "{first} then {second}");
        } else {
            eprintln!("no /proc/pressure/cpu here: the stall reading is not exercised");
            assert_eq!(read_cpu_stall_us(), None);
        }
    }

    #[test]
    fn a_fresh_thread_polls_unless_the_host_is_busy() {
        let g = Governor::default();
        assert_eq!(g.verdict(0, None), Verdict::Poll);
        assert_eq!(g.verdict(0, load(0.3, 2)), Verdict::Poll);
        assert_eq!(g.verdict(0, load(2.0, 2)), Verdict::HostBusy);
        assert_eq!(g.verdict(0, load(0.0, 1)), Verdict::HostBusy);
    }

    #[test]
    fn clean_spins_never_pause() {
        let mut g = Governor::default();
        for i in 0..10_000 {
            g.record(i * 1000, clean());
            assert_eq!(g.verdict(i * 1000, None), Verdict::Poll);
        }
    }

    #[test]
    fn two_strikes_in_a_row_pause_for_a_millisecond_then_polling_resumes() {
        {
            let mut g = Governor::default();
            g.record(10 * MS, descheduled());
            assert_eq!(g.verdict(10 * MS, None), Verdict::Poll, "one strike");
            g.record(10 * MS, descheduled());
            assert_eq!(g.ask(10 * MS, None), Verdict::BackingOff);
            assert_eq!(g.verdict(11 * MS - 1, None), Verdict::BackingOff);
            assert_eq!(g.verdict(11 * MS, None), Verdict::Poll);
            // A busy host wins over a pause that is over.
            assert_eq!(g.verdict(11 * MS, load(1.5, 2)), Verdict::HostBusy);
        }
    }

    #[test]
    fn a_budget_that_keeps_running_out_pauses_and_one_that_sometimes_does_not() {
        // Eight expired spins in a row: a pause.
        let mut g = Governor::default();
        for i in 0..7 {
            g.record(i * MS, expired());
            assert_eq!(g.verdict(i * MS, None), Verdict::Poll, "spin {i}");
        }
        g.record(7 * MS, expired());
        assert_eq!(g.verdict(7 * MS, None), Verdict::BackingOff);
        // One in four expired (a responder that sometimes wakes slowly): no pause, ever.
        let mut g = Governor::default();
        for i in 0..1000u64 {
            g.record(i * MS, if i % 4 == 0 { expired() } else { clean() });
            assert_eq!(g.verdict(i * MS, None), Verdict::Poll, "spin {i}");
        }
        // Half of them: pauses come.
        let mut g = Governor::default();
        let paused = (0..100u64).any(|i| {
            g.record(i * MS, if i % 2 == 0 { expired() } else { clean() });
            g.verdict(i * MS, None) == Verdict::BackingOff
        });
        assert!(paused);
    }

    /// A pause lasts its time and its calls: with calls slower than the pause (a responder that
    /// takes longer than every budget), each pause still skips 1, 2, 4, … calls, so a thread
    /// whose budget always runs out spins on fewer and fewer of its calls.
    #[test]
    fn a_pause_lasts_its_calls_however_slowly_they_come() {
        let mut now = 0;
        // The calls each pause took: 1, 2, 4, ... up to 64.
        let mut g = Governor::default();
        let mut per_pause = Vec::new();
        for _ in 0..9 {
            for _ in 0..8 {
                assert_eq!(g.ask(now, None), Verdict::Poll);
                g.record(now, expired());
            }
            let mut n = 0;
            while g.ask(now + 1000 * MS, None) == Verdict::BackingOff {
                n += 1;
            }
            per_pause.push(n);
            now += 1000 * MS;
        }
        assert_eq!(per_pause, [1, 2, 4, 8, 16, 32, 64, 64, 64]);
        // Expired spins do not shorten pauses; answered ones do.
        assert_eq!(g.next_pause(), FIRST_PAUSE * 64);
        for _ in 0..FORGIVE_AFTER {
            g.record(now, clean());
        }
        assert_eq!(g.next_pause(), FIRST_PAUSE * 32);
    }

    #[test]
    fn rare_strikes_are_tolerated_and_frequent_ones_are_not() {
        // One strike in ten spins: the debt never reaches a pause.
        let mut g = Governor::default();
        for i in 0..1000u64 {
            g.record(i * MS, if i % 10 == 0 { descheduled() } else { clean() });
            assert_eq!(g.verdict(i * MS, None), Verdict::Poll, "spin {i}");
        }
        // One in three: pauses come.
        let mut g = Governor::default();
        let paused = (0..100u64).any(|i| {
            g.record(i * MS, if i % 3 == 0 { descheduled() } else { clean() });
            g.verdict(i * MS, None) == Verdict::BackingOff
        });
        assert!(paused);
    }

    #[test]
    fn pauses_double_while_strikes_continue_and_shrink_after_clean_runs() {
        let mut g = Governor::default();
        let mut now = 0;
        let mut pauses = Vec::new();
        for _ in 0..10 {
            g.record(now, descheduled());
            g.record(now, descheduled());
            let started = now;
            while g.ask(now, None) == Verdict::BackingOff {
                now += MS / 4;
            }
            pauses.push((now - started) / MS);
        }
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 64, 64, 64, 64]);
        // Each run of clean spins shortens the next pause one step.
        for _ in 0..2 * FORGIVE_AFTER {
            g.record(now, clean());
        }
        assert_eq!(g.next_pause(), Duration::from_millis(16));
        for _ in 0..10 * FORGIVE_AFTER {
            g.record(now, clean());
        }
        assert_eq!(g.next_pause(), FIRST_PAUSE);
        assert_eq!(g.verdict(now, None), Verdict::Poll);
    }

    #[test]
    fn the_host_reading_is_smoothed() {
        assert_eq!(smooth(u64::MAX, 3000), 3000);
        assert_eq!(smooth(0, 4000), 1000);
        assert_eq!(smooth(4000, 0), 3000);
        // A lasting change is followed within a few samples; one odd sample is not.
        let mut v = smooth(u64::MAX, 0);
        v = smooth(v, 2000);
        assert!(v < 1000);
        for _ in 0..6 {
            v = smooth(v, 2000);
        }
        assert!(v >= 1000, "{v}");
    }

    #[test]
    fn loadavg_lines_are_parsed() {
        assert_eq!(parse_runnable("0.52 0.58 0.59 3/612 12345\n"), Some(3));
        assert_eq!(parse_runnable("9.86 5.64 2.51 13/192 25872"), Some(13));
        assert_eq!(parse_runnable("0.52 0.58 0.59"), None);
        assert_eq!(parse_runnable("a b c x/1 2"), None);
        assert_eq!(parse_runnable(""), None);
    }

    /// Where the kernel has the file, it reads (and again: the file is read at offset 0).
    #[test]
    fn the_kernel_reading_is_a_count() {
        if std::path::Path::new("/proc/loadavg").exists() {
            let first = read_runnable().expect("runnable count");
            assert!(first >= 1, "the reader itself runs");
            assert!(read_runnable().is_some());
        } else {
            assert_eq!(read_runnable(), None);
        }
    }

    #[test]
    fn forced_readings_and_always_decide_without_the_kernel() {
        let busy = PollPolicy::AdaptiveWith(HostLoad {
            others_runnable: 4.0,
            cores: 2,
            waiting_for_cpu: Some(0.5),
        });
        let idle = PollPolicy::AdaptiveWith(HostLoad {
            others_runnable: 0.0,
            cores: 2,
            waiting_for_cpu: None,
        });
        std::thread::spawn(move || {
            assert_eq!(decide(busy), Verdict::HostBusy);
            assert_eq!(decide(idle), Verdict::Poll);
            assert_eq!(decide(PollPolicy::Always), Verdict::Poll);
            // Strikes go to this thread's record under the adaptive policies, and `Always`
            // keeps polling whatever the record says.
            report(PollPolicy::Always, expired());
            assert_eq!(GOVERNOR.with(Cell::get), Governor::default());
            report(idle, descheduled());
            report(idle, descheduled());
            assert_ne!(GOVERNOR.with(Cell::get).quiet_until_ns, 0);
            assert_eq!(decide(PollPolicy::Always), Verdict::Poll);
        })
        .join()
        .unwrap();
        // Another thread has its own record.
        assert_eq!(GOVERNOR.with(Cell::get), Governor::default());
    }
}
