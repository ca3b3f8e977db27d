//! The conformance suite against the bucket backend, with 64 KiB buckets so that eviction-test
//! objects (64 KiB each) fill one bucket each and small objects share buckets.
#[macro_use]
mod conformance;

use mooncake_storage::{BackendConfig, BucketBackend, BucketOptions, StorageBackend};

conformance_suite!(bucket, |c: BackendConfig| {
    let options = BucketOptions {
        bucket_size_limit_bytes: 64 * 1024,
        ..BucketOptions::default()
    };
    BucketBackend::open_with(c, options).map(|b| Box::new(b) as Box<dyn StorageBackend>)
});
