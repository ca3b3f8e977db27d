//! Crash-test child: writes random batches to a backend until it is killed, logging its intent
//! before every operation and the acknowledgement after it (each line fsync'ed), so that the
//! parent (`tests/crash/mod.rs`) knows exactly which objects were acknowledged when the SIGKILL
//! landed.
//!
//! Usage: `storage-crash-child <kind> <dir> <durability> <ack-log> <run-id> <seed>`
//!
//! Ack log lines: `P <n>` then `n` lines `E <key> <version> <len>` (a put batch is about to be
//! issued); `D <key>` (a remove is about to be issued); `A <r1> … <rn>` (the pending operation
//! returned; `1` = acknowledged, `0` = failed, per entry). Values are
//! `testkit::value_for(key, version, len)`.

use mooncake_storage::testkit::{value_for, Rng};
use mooncake_storage::{open_backend, BackendConfig, BackendKind, Durability};
use std::fs::OpenOptions;
use std::io::Write;
use std::process::ExitCode;

const KEY_SPACE: u64 = 64;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("storage-crash-child: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 7 {
        return Err("usage: <kind> <dir> <durability> <ack-log> <run-id> <seed>".into());
    }
    let kind: BackendKind = args[1].parse().map_err(|e| format!("{e}"))?;
    let durability: Durability = args[3].parse().map_err(|e| format!("{e}"))?;
    let run_id: u64 = args[5].parse().map_err(|_| "bad run id")?;
    let seed: u64 = args[6].parse().map_err(|_| "bad seed")?;
    let config = BackendConfig::new(&args[2], 1 << 30).with_durability(durability);
    let backend = open_backend(kind, config).map_err(|e| format!("open: {e}"))?;
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args[4])
        .map_err(|e| format!("ack log: {e}"))?;
    let mut emit = |text: &str| -> Result<(), String> {
        log.write_all(text.as_bytes())
            .and_then(|()| log.sync_data())
            .map_err(|e| e.to_string())
    };
    let mut rng = Rng::new(seed ^ (run_id << 20));
    let mut version = run_id << 32;
    for op in 0u64.. {
        if rng.below(8) == 0 {
            let key = format!("k{}", rng.below(KEY_SPACE));
            emit(&format!("D {key}\n"))?;
            let ok = backend.remove(&key).is_ok();
            emit(&format!("A {}\n", u8::from(ok)))?;
            continue;
        }
        let n = 1 + rng.below(6) as usize;
        let mut plan = Vec::with_capacity(n);
        let mut intent = format!("P {n}\n");
        for _ in 0..n {
            let key = format!("k{}", rng.below(KEY_SPACE));
            let len = match rng.below(10) {
                0 => 0,
                1 => rng.below(256 * 1024) as usize,
                _ => rng.below(64 * 1024) as usize,
            };
            version += 1;
            intent.push_str(&format!("E {key} {version} {len}\n"));
            let value = value_for(&key, version, len);
            plan.push((key, value));
        }
        emit(&intent)?;
        let entries: Vec<(&str, &[u8])> = plan
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        let results = backend.put_batch(&entries);
        let mut ack = String::from("A");
        for r in &results {
            ack.push_str(if r.is_ok() { " 1" } else { " 0" });
        }
        ack.push('\n');
        emit(&ack)?;
        if op % 16 == 15 {
            // Seal partial buckets / write checkpoints now and then, so kills land there too.
            backend.flush().map_err(|e| format!("flush: {e}"))?;
        }
    }
    Ok(())
}
