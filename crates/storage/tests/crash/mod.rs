//! Crash harness: runs `storage-crash-child` against a backend, SIGKILLs it at random points,
//! reopens the store in this process and checks it against the child's fsync'ed ack log:
//! - every object acknowledged (under `batch`/`always`; under `none` too, since SIGKILL keeps the
//!   page cache) is present and byte-exact;
//! - an operation in flight at the kill is all-or-nothing per entry: each of its keys holds the
//!   acknowledged value or one of the in-flight values (or is absent for an in-flight remove);
//! - nothing else is listed, every listed object reads back whole (no torn or corrupt record is
//!   ever returned, no read fails), and `scan` sizes match the values.
//!
//! The store is reused across kill points, so recovery also runs over images left by earlier
//! recoveries. Kill points per call: `STORAGE_CRASH_KILL_POINTS` (default given by the caller).
#![allow(clippy::unwrap_used, dead_code)]

use mooncake_storage::testkit::{value_for, Rng};
use mooncake_storage::{open_backend, BackendConfig, BackendKind, Durability, StorageBackend};
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a key holds: `Some((version, len))` or absent.
type State = Option<(u64, usize)>;

/// Kill points to run: `STORAGE_CRASH_KILL_POINTS` if set, else `default`.
pub fn kill_points(default: usize) -> usize {
    std::env::var("STORAGE_CRASH_KILL_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

enum Pending {
    Put(Vec<(String, u64, usize)>),
    Remove(String),
}

/// Parses the ack log. Applies acknowledged operations to `model`; returns the operation that was
/// in flight at the kill, if any, and keys whose outcome is uncertain (failed entries).
fn apply_log(text: &str, model: &mut BTreeMap<String, State>) -> (Option<Pending>, Vec<Pending>) {
    let mut pending: Option<Pending> = None;
    let mut uncertain = Vec::new();
    let mut lines = text
        .split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .map(str::trim_end);
    while let Some(line) = lines.next() {
        let mut parts = line.split(' ');
        match parts.next() {
            Some("P") => {
                let n: usize = parts.next().unwrap().parse().unwrap();
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    // The intent block is written with one write + fsync; a kill can only cut
                    // it short, in which case the put was never issued.
                    let Some(e) = lines.next() else {
                        return (None, uncertain);
                    };
                    let f: Vec<&str> = e.split(' ').collect();
                    assert_eq!(f[0], "E", "bad ack log line {e:?}");
                    entries.push((
                        f[1].to_string(),
                        f[2].parse().unwrap(),
                        f[3].parse().unwrap(),
                    ));
                }
                pending = Some(Pending::Put(entries));
            }
            Some("D") => pending = Some(Pending::Remove(parts.next().unwrap().to_string())),
            Some("A") => {
                let oks: Vec<bool> = parts.map(|p| p == "1").collect();
                match pending.take().expect("ack without intent") {
                    Pending::Put(entries) => {
                        assert_eq!(entries.len(), oks.len());
                        for ((key, version, len), ok) in entries.into_iter().zip(oks) {
                            if ok {
                                model.insert(key, Some((version, len)));
                            } else {
                                uncertain.push(Pending::Put(vec![(key, version, len)]));
                            }
                        }
                    }
                    Pending::Remove(key) => {
                        if oks == [true] {
                            model.insert(key, None);
                        } else {
                            uncertain.push(Pending::Remove(key));
                        }
                    }
                }
            }
            other => panic!("bad ack log line {other:?}"),
        }
    }
    (pending, uncertain)
}

/// Runs `kill_points` kill/verify rounds of `kind` under `durability`.
pub fn run(kind: BackendKind, durability: Durability, kill_points: usize, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ack = dir.path().join("ack.log");
    let config = BackendConfig::new(&store, 1 << 30).with_durability(durability);
    let durability_name = match durability {
        Durability::None => "none",
        Durability::Batch => "batch",
        Durability::Always => "always",
    };
    let mut model: BTreeMap<String, State> = BTreeMap::new();
    let mut rng = Rng::new(seed);
    let deadline = Instant::now() + Duration::from_secs(600);
    let (mut acked_total, mut in_flight_total) = (0usize, 0usize);
    let mut history: BTreeMap<String, Vec<(usize, u64, usize)>> = BTreeMap::new();
    for round in 0..kill_points {
        assert!(Instant::now() < deadline, "crash test over its time bound");
        std::fs::write(&ack, b"").unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_storage-crash-child"))
            .arg(kind.name())
            .arg(&store)
            .arg(durability_name)
            .arg(&ack)
            .arg((round + 1).to_string())
            .arg(seed.to_string())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        // Let it recover and write for a random while, then SIGKILL.
        std::thread::sleep(Duration::from_millis(30 + rng.below(220)));
        if let Ok(Some(status)) = child.try_wait() {
            panic!("round {round}: child exited early with {status}");
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let text = std::fs::read_to_string(&ack).unwrap();
        let (pending, uncertain) = apply_log(&text, &mut model);
        for line in text.lines().filter(|l| l.starts_with("E ")) {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() == 4 {
                let (Ok(v), Ok(len)) = (f[2].parse(), f[3].parse()) else {
                    continue;
                };
                history
                    .entry(f[1].to_string())
                    .or_default()
                    .push((round, v, len));
            }
        }
        acked_total += text.lines().filter(|l| l.starts_with('A')).count();
        // Alternatives per key: what the model says, plus what the in-flight op may have done.
        let mut alternatives: BTreeMap<String, BTreeSet<State>> = BTreeMap::new();
        for (k, s) in &model {
            alternatives.entry(k.clone()).or_default().insert(*s);
        }
        let mut in_flight: Vec<Pending> = uncertain;
        in_flight.extend(pending);
        for op in &in_flight {
            in_flight_total += 1;
            match op {
                Pending::Put(entries) => {
                    for (k, v, len) in entries {
                        let alt = alternatives.entry(k.clone()).or_default();
                        alt.insert(model.get(k).copied().flatten());
                        alt.insert(Some((*v, *len)));
                    }
                }
                Pending::Remove(k) => {
                    let alt = alternatives.entry(k.clone()).or_default();
                    alt.insert(model.get(k).copied().flatten());
                    alt.insert(None);
                }
            }
        }
        let backend = open_backend(kind, config.clone())
            .unwrap_or_else(|e| panic!("round {round}: reopen after SIGKILL failed: {e}"));
        let actual = verify(&*backend, &alternatives, &history, round);
        // The in-flight keys now hold what the store actually kept.
        for (k, s) in actual {
            model.insert(k, s);
        }
        backend.close().unwrap();
    }
    let live = model.values().filter(|s| s.is_some()).count();
    eprintln!(
        "crash {kind}/{durability_name}: {kill_points} kill points, {acked_total} acknowledged \
         operations checked, {in_flight_total} in flight at a kill, {live} objects live at the end"
    );
}

/// Checks the reopened store against the alternatives; returns the observed state of every key.
fn verify(
    b: &dyn StorageBackend,
    alternatives: &BTreeMap<String, BTreeSet<State>>,
    history: &BTreeMap<String, Vec<(usize, u64, usize)>>,
    round: usize,
) -> BTreeMap<String, State> {
    let listed: BTreeMap<String, u64> = b
        .scan()
        .into_iter()
        .map(|o| (o.key, o.size_bytes))
        .collect();
    for k in listed.keys() {
        assert!(
            alternatives.contains_key(k),
            "round {round}: unknown key {k:?} listed"
        );
    }
    let mut observed = BTreeMap::new();
    let mut used = 0u64;
    for (k, alts) in alternatives {
        let state = match listed.get(k) {
            None => {
                assert!(
                    alts.contains(&None),
                    "round {round}: acknowledged object {k:?} lost; expected one of {alts:?}"
                );
                None
            }
            Some(size) => {
                let mut buf = vec![0u8; *size as usize];
                let n = b
                    .get_batch(&[k], &mut [&mut buf[..]])
                    .pop()
                    .unwrap()
                    .unwrap_or_else(|e| {
                        panic!("round {round}: listed object {k:?} does not read back: {e}")
                    });
                assert_eq!(n, *size);
                used += n;
                let found = alts
                    .iter()
                    .flatten()
                    .find(|(v, len)| *len as u64 == n && value_for(k, *v, *len) == buf);
                match found {
                    Some(s) => Some(*s),
                    None => {
                        let old = history.get(k).and_then(|h| {
                            h.iter().find(|(_, v, len)| {
                                *len as u64 == n && value_for(k, *v, *len) == buf
                            })
                        });
                        panic!(
                            "round {round}: {k:?} holds {n} bytes matching none of {alts:?} \
                             (torn, corrupt or stale); matches an older write (round, \
                             version, len): {old:?}; history: {:?}",
                            history.get(k)
                        )
                    }
                }
            }
        };
        observed.insert(k.clone(), state);
    }
    let usage = b.usage();
    assert_eq!(
        usage.object_count as usize,
        listed.len(),
        "round {round}: usage count"
    );
    assert_eq!(usage.used_bytes, used, "round {round}: usage bytes");
    observed
}
