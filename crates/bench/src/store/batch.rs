//! Batch cases of client A: put_batch, batch_put_from, get_batch, batch_get_into.

use anyhow::Context;
use std::time::Instant;

use super::report::row;
use super::single::{value_bytes, Bench, Deadline, Registered};

impl Bench<'_> {
    pub(super) async fn bench_batch(&mut self, zcopy: bool) -> anyhow::Result<()> {
        let size = self.a.batch_value;
        let b = self.a.batch;
        let val = value_bytes(size, size);
        let mut reg = if zcopy {
            let mut r = Registered::new(self.s, size as usize * b)?;
            for chunk in r.buf.chunks_mut(size as usize) {
                chunk.copy_from_slice(&val);
            }
            Some(r)
        } else {
            None
        };
        let api = if zcopy { "zcopy" } else { "plain" };
        let rounds_per_window = (self.window(size) / b).max(1);
        let mut lats = Vec::new();
        let mut errors = 0;
        let mut rnd = 0;
        for record in [false, true] {
            let dl = Deadline::new(self.a.seconds, self.a.max_ops);
            loop {
                let mut live = Vec::new();
                for _ in 0..rounds_per_window {
                    let keys: Vec<String> = (0..b)
                        .map(|i| format!("{}/bput/{api}/{size}/r{rnd}/{i}", self.tag))
                        .collect();
                    rnd += 1;
                    let items: Vec<(&str, &[u8])> = match &reg {
                        None => keys.iter().map(|k| (k.as_str(), &val[..])).collect(),
                        Some(r) => keys
                            .iter()
                            .zip(r.buf.chunks(size as usize))
                            .map(|(k, c)| (k.as_str(), c))
                            .collect(),
                    };
                    let t = Instant::now();
                    let results = self.s.put_batch(&items, &self.config).await;
                    let dt = t.elapsed();
                    live.extend(keys.iter().cloned());
                    if record {
                        lats.push(dt);
                        errors += usize::from(results.iter().any(|r| r.is_err()));
                    }
                    if dl.done(if record { lats.len() } else { 0 }) {
                        break;
                    }
                }
                self.cleanup(&live).await;
                if !record || dl.done(lats.len()) {
                    break;
                }
            }
        }
        let put_name = if zcopy { "batch_put_from" } else { "put_batch" };
        self.add(row(
            put_name,
            api,
            size,
            b,
            &lats,
            errors,
            format!("batch={b}"),
        ));

        let keys: Vec<String> = (0..b)
            .map(|i| format!("{}/bget/{api}/{size}/{i}", self.tag))
            .collect();
        let items: Vec<(&str, &[u8])> = keys.iter().map(|k| (k.as_str(), &val[..])).collect();
        for r in self.s.put_batch(&items, &self.config).await {
            r.context("prepare put_batch")?;
        }
        let refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        let mut lats = Vec::new();
        let mut errors = 0;
        let dl = Deadline::new(self.a.seconds, self.a.max_ops);
        let mut first = true;
        while !dl.done(lats.len()) {
            match &mut reg {
                None => {
                    let t = Instant::now();
                    let got = self.s.get_batch(&refs).await;
                    lats.push(t.elapsed());
                    let mut err = got
                        .iter()
                        .any(|g| !g.as_ref().is_ok_and(|v| v.len() as u64 == size));
                    if first {
                        err |= got.iter().any(|g| !g.as_ref().is_ok_and(|v| *v == val));
                    }
                    errors += usize::from(err);
                }
                Some(r) => {
                    if first {
                        r.buf.fill(0);
                    }
                    let mut outs: Vec<&mut [u8]> = r.buf.chunks_mut(size as usize).collect();
                    let t = Instant::now();
                    let got = self.s.get_batch_into(&refs, &mut outs).await;
                    lats.push(t.elapsed());
                    let mut err = got.iter().any(|g| !matches!(g, Ok(n) if *n == size));
                    if first {
                        err |= r.buf.chunks(size as usize).any(|c| c != &val[..]);
                    }
                    errors += usize::from(err);
                }
            }
            first = false;
        }
        drop(reg);
        self.cleanup(&keys).await;
        let get_name = if zcopy { "batch_get_into" } else { "get_batch" };
        self.add(row(
            get_name,
            api,
            size,
            b,
            &lats,
            errors,
            format!("batch={b}"),
        ));
        Ok(())
    }
}
