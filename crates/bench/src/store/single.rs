//! Single-client, single-key cases (put, get, put_from, get_into, is_exist, batch_is_exist) and
//! what every case shares: the time/op bound, value bytes, registered buffers.

use anyhow::Context;
use mooncake_client::StoreClient;
use mooncake_common::ReplicateConfig;
use std::time::{Duration, Instant};

use super::report::{format_row, row, Row};
use super::Args;
use crate::fill_pattern;

pub(super) struct Deadline {
    end: Instant,
    max_ops: usize,
}

impl Deadline {
    pub(super) fn new(seconds: f64, max_ops: usize) -> Deadline {
        Deadline {
            end: Instant::now() + Duration::from_secs_f64(seconds),
            max_ops,
        }
    }
    pub(super) fn done(&self, ops: usize) -> bool {
        ops >= self.max_ops || Instant::now() >= self.end
    }
}

pub(super) fn value_bytes(size: u64, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; size as usize];
    fill_pattern(&mut v, seed);
    v
}

/// A buffer registered with the client for zero-copy calls; unregistered on drop.
pub(super) struct Registered<'a> {
    client: &'a StoreClient,
    pub(super) buf: Vec<u8>,
}

impl<'a> Registered<'a> {
    pub(super) fn new(client: &'a StoreClient, len: usize) -> anyhow::Result<Registered<'a>> {
        let mut buf = vec![0u8; len.max(1)];
        // SAFETY: `buf` lives in the returned value, which unregisters it before dropping it.
        unsafe { client.register_buffer(buf.as_mut_ptr(), buf.len()) }?;
        Ok(Registered { client, buf })
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let _ = self.client.unregister_buffer(self.buf.as_mut_ptr());
    }
}

pub(super) struct Bench<'a> {
    pub(super) a: &'a Args,
    pub(super) s: &'a StoreClient,
    pub(super) tag: String,
    pub(super) results: Vec<Row>,
    pub(super) config: ReplicateConfig,
}

impl Bench<'_> {
    pub(super) fn window(&self, size: u64) -> usize {
        ((self.a.window_bytes / size.max(1)) as usize).clamp(1, self.a.max_window)
    }

    pub(super) async fn cleanup(&self, keys: &[String]) {
        let refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        for chunk in refs.chunks(1000) {
            let _ = self.s.batch_remove(chunk, true).await;
        }
    }

    pub(super) fn add(&mut self, r: Row) {
        eprintln!("{}", format_row(&r));
        self.results.push(r);
    }

    pub(super) async fn bench_put(&mut self, size: u64, zcopy: bool) -> anyhow::Result<()> {
        let val = value_bytes(size, size);
        let mut reg = if zcopy {
            let mut r = Registered::new(self.s, size as usize)?;
            r.buf.copy_from_slice(&val);
            Some(r)
        } else {
            None
        };
        let w = self.window(size);
        let name = if zcopy { "put_from" } else { "put" };
        let mut lats = Vec::new();
        let mut errors = 0;
        let mut rnd = 0;
        for record in [false, true] {
            let dl = Deadline::new(self.a.seconds, self.a.max_ops);
            loop {
                let mut done = Vec::new();
                for i in 0..w {
                    let key = format!("{}/{name}/{size}/r{rnd}/{i}", self.tag);
                    let value: &[u8] = match &mut reg {
                        Some(r) => &r.buf,
                        None => &val,
                    };
                    let t = Instant::now();
                    let result = self.s.put(&key, value, &self.config).await;
                    let dt = t.elapsed();
                    done.push(key);
                    if record {
                        lats.push(dt);
                        errors += usize::from(result.is_err());
                    }
                    if dl.done(if record { lats.len() } else { 0 }) {
                        break;
                    }
                }
                rnd += 1;
                self.cleanup(&done).await;
                if !record || dl.done(lats.len()) {
                    break;
                }
            }
        }
        drop(reg);
        let api = if zcopy { "zcopy" } else { "plain" };
        self.add(row(
            name,
            api,
            size,
            1,
            &lats,
            errors,
            format!("window={w}"),
        ));
        Ok(())
    }

    pub(super) async fn bench_get(&mut self, size: u64, zcopy: bool) -> anyhow::Result<()> {
        let w = self.window(size);
        let api = if zcopy { "zcopy" } else { "plain" };
        let mut keys = Vec::new();
        let mut vals = Vec::new();
        for i in 0..w {
            let key = format!("{}/getset-{api}/{size}/{i}", self.tag);
            let v = if i < 4 {
                value_bytes(size, 1_000_003 * size + i as u64)
            } else {
                value_bytes(size, size)
            };
            self.s
                .put(&key, &v, &self.config)
                .await
                .with_context(|| format!("prepare put {key}"))?;
            keys.push(key);
            if i < 4 {
                vals.push(v);
            }
        }
        let mut reg = if zcopy {
            Some(Registered::new(self.s, size as usize)?)
        } else {
            None
        };
        let mut bad = 0;
        for (k, v) in keys.iter().zip(&vals) {
            let ok = match &mut reg {
                None => self.s.get(k).await.is_ok_and(|got| got == *v),
                Some(r) => {
                    let n = self.s.get_into(k, &mut r.buf).await;
                    n.is_ok_and(|n| n == size) && r.buf[..size as usize] == v[..]
                }
            };
            bad += usize::from(!ok);
        }
        let mut lats = Vec::new();
        let mut errors = bad;
        let dl = Deadline::new(self.a.seconds, self.a.max_ops);
        let mut i = 0;
        let mut warm = self.a.warmup;
        while !dl.done(lats.len()) {
            let k = &keys[i % w];
            i += 1;
            let t = Instant::now();
            let ok = match &mut reg {
                None => self.s.get(k).await.is_ok_and(|g| g.len() as u64 == size),
                Some(r) => self
                    .s
                    .get_into(k, &mut r.buf)
                    .await
                    .is_ok_and(|n| n == size),
            };
            let dt = t.elapsed();
            errors += usize::from(!ok);
            if warm > 0 {
                warm -= 1;
            } else {
                lats.push(dt);
            }
        }
        drop(reg);
        self.cleanup(&keys).await;
        let verify = if bad == 0 {
            "ok".to_string()
        } else {
            format!("FAIL{bad}")
        };
        let name = if zcopy { "get_into" } else { "get" };
        self.add(row(
            name,
            api,
            size,
            1,
            &lats,
            errors,
            format!("window={w} verify={verify}"),
        ));
        Ok(())
    }

    pub(super) async fn bench_exist(&mut self) -> anyhow::Result<()> {
        let k = format!("{}/exist/key", self.tag);
        self.s.put(&k, &[b'x'; 4096], &self.config).await?;
        for (label, key, expect) in [
            ("is_exist(hit)", k.clone(), true),
            ("is_exist(miss)", format!("{k}-missing"), false),
        ] {
            let mut lats = Vec::new();
            let mut errors = 0;
            let dl = Deadline::new(self.a.seconds, self.a.max_ops);
            while !dl.done(lats.len()) {
                let t = Instant::now();
                let r = self.s.is_exist(&key).await;
                lats.push(t.elapsed());
                errors += usize::from(!matches!(r, Ok(v) if v == expect));
            }
            self.add(row(label, "meta", 0, 1, &lats, errors, String::new()));
        }
        let keys: Vec<String> = (0..self.a.batch)
            .map(|i| format!("{}/bexist/{i}", self.tag))
            .collect();
        let value = [b'y'; 64];
        let items: Vec<(&str, &[u8])> = keys.iter().map(|k| (k.as_str(), &value[..])).collect();
        for r in self.s.put_batch(&items, &self.config).await {
            r?;
        }
        let refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        let mut lats = Vec::new();
        let mut errors = 0;
        let dl = Deadline::new(self.a.seconds, self.a.max_ops);
        while !dl.done(lats.len()) {
            let t = Instant::now();
            let r = self.s.batch_is_exist(&refs).await;
            lats.push(t.elapsed());
            errors += usize::from(!r.is_ok_and(|v| v.iter().all(|x| matches!(x, Ok(true)))));
        }
        let n = keys.len();
        self.add(row(
            "batch_is_exist",
            "meta",
            0,
            n,
            &lats,
            errors,
            format!("batch={n}"),
        ));
        let mut all = keys;
        all.push(k);
        self.cleanup(&all).await;
        Ok(())
    }
}
