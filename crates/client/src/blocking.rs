//! A blocking facade over [`StoreClient`] that owns its tokio runtime: for programs without an
//! async runtime (the CLI verbs, the Python package). Any number of threads may call one
//! instance at once; each call blocks only its own thread.

use mooncake_common::{ErrorCode, ReplicaDescriptor, ReplicateConfig, Segment};
use std::future::Future;

use crate::store::{PutOutcome, StoreClient, StoreConfig, StoreError};

/// A store client for synchronous code.
#[derive(Debug)]
pub struct BlockingStoreClient {
    runtime: tokio::runtime::Runtime,
    client: StoreClient,
}

impl BlockingStoreClient {
    /// Starts a runtime with `io_threads` workers (2 if 0) and connects.
    pub fn connect(config: StoreConfig, io_threads: usize) -> Result<Self, StoreError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(if io_threads == 0 { 2 } else { io_threads })
            .thread_name("mooncake-store-io")
            .enable_all()
            .build()
            .map_err(|e| StoreError::InvalidParams(format!("cannot start the I/O runtime: {e}")))?;
        let client = runtime.block_on(StoreClient::connect(config))?;
        Ok(BlockingStoreClient { runtime, client })
    }

    /// The async client (for code that has a runtime after all).
    pub fn client(&self) -> &StoreClient {
        &self.client
    }

    fn run<T>(&self, future: impl Future<Output = T>) -> T {
        self.runtime.block_on(future)
    }

    /// Runs any future on this client's runtime (for calls this type does not wrap, e.g.
    /// `client().master().call(..)`). Must not be called from inside an async context.
    pub fn block_on<T>(&self, future: impl Future<Output = T>) -> T {
        self.runtime.block_on(future)
    }

    pub fn put(
        &self,
        key: &str,
        value: &[u8],
        config: &ReplicateConfig,
    ) -> Result<PutOutcome, StoreError> {
        self.run(self.client.put(key, value, config))
    }

    /// [`StoreClient::put_counted`]: the outcome and the number of replicas written.
    pub fn put_counted(
        &self,
        key: &str,
        value: &[u8],
        config: &ReplicateConfig,
    ) -> Result<(PutOutcome, usize), StoreError> {
        self.run(self.client.put_counted(key, value, config))
    }

    pub fn put_parts(
        &self,
        key: &str,
        parts: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Result<PutOutcome, StoreError> {
        self.run(self.client.put_parts(key, parts, config))
    }

    pub fn put_batch(
        &self,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
    ) -> Vec<Result<PutOutcome, StoreError>> {
        self.run(self.client.put_batch(items, config))
    }

    pub fn upsert(
        &self,
        key: &str,
        value: &[u8],
        config: &ReplicateConfig,
    ) -> Result<(), StoreError> {
        self.run(self.client.upsert(key, value, config))
    }

    pub fn upsert_batch(
        &self,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
    ) -> Vec<Result<(), StoreError>> {
        self.run(self.client.upsert_batch(items, config))
    }

    pub fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.run(self.client.get(key))
    }

    pub fn get_into(&self, key: &str, buffer: &mut [u8]) -> Result<u64, StoreError> {
        self.run(self.client.get_into(key, buffer))
    }

    pub fn get_batch(&self, keys: &[&str]) -> Vec<Result<Vec<u8>, StoreError>> {
        self.run(self.client.get_batch(keys))
    }

    pub fn get_batch_into(
        &self,
        keys: &[&str],
        buffers: &mut [&mut [u8]],
    ) -> Vec<Result<u64, StoreError>> {
        self.run(self.client.get_batch_into(keys, buffers))
    }

    pub fn is_exist(&self, key: &str) -> Result<bool, StoreError> {
        self.run(self.client.is_exist(key))
    }

    pub fn batch_is_exist(
        &self,
        keys: &[&str],
    ) -> Result<Vec<Result<bool, ErrorCode>>, StoreError> {
        self.run(self.client.batch_is_exist(keys))
    }

    pub fn get_size(&self, key: &str) -> Result<u64, StoreError> {
        self.run(self.client.get_size(key))
    }

    pub fn get_replica_desc(&self, key: &str) -> Result<Vec<ReplicaDescriptor>, StoreError> {
        self.run(self.client.get_replica_desc(key))
    }

    pub fn remove(&self, key: &str, force: bool) -> Result<(), StoreError> {
        self.run(self.client.remove(key, force))
    }

    pub fn batch_remove(
        &self,
        keys: &[&str],
        force: bool,
    ) -> Result<Vec<Result<(), ErrorCode>>, StoreError> {
        self.run(self.client.batch_remove(keys, force))
    }

    pub fn remove_by_regex(&self, regex: &str, force: bool) -> Result<i64, StoreError> {
        self.run(self.client.remove_by_regex(regex, force))
    }

    pub fn remove_all(&self, force: bool) -> Result<i64, StoreError> {
        self.run(self.client.remove_all(force))
    }

    pub fn mount_segment(&self, size_bytes: u64) -> Result<Segment, StoreError> {
        self.run(self.client.mount_segment(size_bytes))
    }

    /// # Safety
    /// As [`StoreClient::register_buffer`].
    pub unsafe fn register_buffer(&self, ptr: *mut u8, len: usize) -> Result<(), StoreError> {
        // SAFETY: forwarded to the caller's contract.
        unsafe { self.client.register_buffer(ptr, len) }
    }

    pub fn unregister_buffer(&self, ptr: *mut u8) -> Result<(), StoreError> {
        self.client.unregister_buffer(ptr)
    }

    /// Unmounts and stops (see [`StoreClient::close`]).
    pub fn close(&self) -> Result<(), StoreError> {
        self.run(self.client.close())
    }
}
