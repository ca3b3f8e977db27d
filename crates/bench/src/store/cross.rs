//! Cross-process cases: client B (`mooncake bench store-peer`, segment 0) reads and writes client
//! A's segment through the transfer engine; it prints its rows for A to collect.

use anyhow::{bail, Context};
use mooncake_client::StoreClient;
use mooncake_common::ReplicateConfig;
use std::process::{Command, Stdio};
use std::time::Instant;

use super::report::{decode_row, encode_row, format_row, row, Row};
use super::single::{value_bytes, Deadline, Registered};
use super::{client_config, runtime, Args, PeerArgs};

pub(super) async fn run_cross(
    args: &Args,
    store: &StoreClient,
    master: &str,
    tag: &str,
) -> anyhow::Result<Vec<Row>> {
    let size = args.cross_size;
    let count = ((args.window_bytes / size.max(1)) as usize).clamp(1, args.max_window);
    let prefix = format!("{tag}/xclient");
    let mut lats = Vec::new();
    let mut keys = Vec::new();
    for i in 0..count {
        let key = format!("{prefix}/{i}");
        let v = value_bytes(size, 7000 + i as u64);
        let t = Instant::now();
        store.put(&key, &v, &ReplicateConfig::default()).await?;
        lats.push(t.elapsed());
        keys.push(key);
    }
    let mut rows = vec![row(
        "xclient_A_put",
        "plain",
        size,
        1,
        &lats,
        0,
        format!("A local put of the {count} keys B reads"),
    )];
    for r in &rows {
        eprintln!("{}", format_row(r));
    }
    let exe = std::env::current_exe()?;
    let output = tokio::task::spawn_blocking({
        let args = args.clone();
        let master = master.to_string();
        move || {
            Command::new(exe)
                .args([
                    "bench",
                    "store-peer",
                    "--master",
                    &master,
                    "--keys",
                    &prefix,
                ])
                .args(["--count", &count.to_string(), "--size", &size.to_string()])
                .args(["--seconds", &args.seconds.to_string()])
                .args(["--max-ops", &args.max_ops.to_string()])
                .args(["--warmup", &args.warmup.to_string()])
                .args(["--window-bytes", &args.window_bytes.to_string()])
                .args(["--max-window", &args.max_window.to_string()])
                .args([
                    "--transport",
                    &format!("{:?}", args.transport).to_lowercase(),
                ])
                .args(
                    args.busy_poll_us
                        .map(|us| ["--busy-poll-us".to_string(), us.to_string()])
                        .into_iter()
                        .flatten(),
                )
                .args(args.no_checksums.then_some("--no-checksums"))
                .args(args.copy.to_args())
                .stderr(Stdio::inherit())
                .output()
        }
    })
    .await??;
    let text = String::from_utf8_lossy(&output.stdout);
    rows.extend(text.lines().filter_map(decode_row));
    if !output.status.success() {
        bail!("the peer process failed: {}", output.status);
    }
    let refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
    let _ = store.batch_remove(&refs, true).await;
    Ok(rows)
}

/// Client B: reads A's keys (get, get_into) and writes into A's segment (put, put_from).
pub fn run_peer(args: PeerArgs) -> anyhow::Result<()> {
    let rt = runtime()?;
    rt.block_on(async {
        let s = StoreClient::connect(client_config(
            &args.master,
            0,
            args.transport,
            args.busy_poll_us,
            !args.no_checksums,
            &args.copy,
        ))
        .await
        .context("client B")?;
        let size = args.size;
        let keys: Vec<String> = (0..args.count)
            .map(|i| format!("{}/{i}", args.keys))
            .collect();
        let mut bad = 0;
        for (i, k) in keys.iter().take(4).enumerate() {
            let ok = s
                .get(k)
                .await
                .is_ok_and(|g| g == value_bytes(size, 7000 + i as u64));
            bad += usize::from(!ok);
        }
        let verify = if bad == 0 {
            "ok".to_string()
        } else {
            format!("FAIL{bad}")
        };
        let mut rows = Vec::new();
        for zcopy in [false, true] {
            let mut reg = if zcopy {
                Some(Registered::new(&s, size as usize)?)
            } else {
                None
            };
            let mut lats = Vec::new();
            let mut errors = bad;
            let dl = Deadline::new(args.seconds, args.max_ops);
            let mut i = 0;
            while !dl.done(lats.len()) {
                let k = &keys[i % keys.len()];
                i += 1;
                let t = Instant::now();
                let ok = match &mut reg {
                    None => s.get(k).await.is_ok_and(|g| g.len() as u64 == size),
                    Some(r) => s.get_into(k, &mut r.buf).await.is_ok_and(|n| n == size),
                };
                let dt = t.elapsed();
                if i > args.warmup {
                    lats.push(dt);
                    errors += usize::from(!ok);
                }
            }
            let (name, api) = if zcopy {
                ("xclient_get_into", "zcopy")
            } else {
                ("xclient_get", "plain")
            };
            rows.push(row(
                name,
                api,
                size,
                1,
                &lats,
                errors,
                format!("B reads A's segment; verify={verify}"),
            ));
        }
        let w = ((args.window_bytes / size.max(1)) as usize).clamp(1, args.max_window);
        let val = value_bytes(size, size);
        for zcopy in [false, true] {
            let mut reg = if zcopy {
                let mut r = Registered::new(&s, size as usize)?;
                r.buf.copy_from_slice(&val);
                Some(r)
            } else {
                None
            };
            let mut lats = Vec::new();
            let mut errors = 0;
            let mut rnd = 0;
            let dl = Deadline::new(args.seconds, args.max_ops);
            while !dl.done(lats.len()) {
                let mut done = Vec::new();
                for i in 0..w {
                    let key = format!("{}-bput/{zcopy}/r{rnd}/{i}", args.keys);
                    let value: &[u8] = match &mut reg {
                        Some(r) => &r.buf,
                        None => &val,
                    };
                    let t = Instant::now();
                    let result = s.put(&key, value, &ReplicateConfig::default()).await;
                    lats.push(t.elapsed());
                    errors += usize::from(result.is_err());
                    done.push(key);
                    if dl.done(lats.len()) {
                        break;
                    }
                }
                rnd += 1;
                let refs: Vec<&str> = done.iter().map(|k| k.as_str()).collect();
                let _ = s.batch_remove(&refs, true).await;
            }
            let (name, api) = if zcopy {
                ("xclient_put_from", "zcopy")
            } else {
                ("xclient_put", "plain")
            };
            rows.push(row(
                name,
                api,
                size,
                1,
                &lats,
                errors,
                format!("B writes to A's segment; window={w}"),
            ));
        }
        for r in &rows {
            eprintln!("{}", format_row(r));
            println!("{}", encode_row(r));
        }
        let _ = s.close().await;
        anyhow::Ok(())
    })
}
