//! The endpoint cache: peers' transfer endpoints parsed once, by the string the master carries
//! in every replica descriptor.

use mooncake_transfer::Endpoint;
use std::collections::HashMap;
use std::sync::Arc;

use super::{StoreClient, StoreError};

/// Parsed endpoints by the string the master carries (about 150 bytes each). The entry used
/// last is checked first, by comparing the bytes: the keys of a batch mostly live on one node,
/// and hashing the string twice per key with SipHash plus the lookup were 1.0-1.6% of the
/// CPU samples of a Python 32 × 64 KiB `batch_get_into` loop (`perf`).
#[derive(Debug, Default)]
pub(super) struct EndpointCache {
    last: Option<(Arc<str>, Arc<Endpoint>)>,
    by_text: HashMap<Arc<str>, Arc<Endpoint>>,
}

impl EndpointCache {
    /// Most endpoints kept (a client talks to every node of a cluster, not more).
    const MAX_ENTRIES: usize = 65_536;

    fn get(&mut self, text: &str) -> Option<Arc<Endpoint>> {
        if let Some((last_text, endpoint)) = &self.last {
            if **last_text == *text {
                return Some(Arc::clone(endpoint));
            }
        }
        let (key, endpoint) = self.by_text.get_key_value(text)?;
        let found = (Arc::clone(key), Arc::clone(endpoint));
        let endpoint = Arc::clone(&found.1);
        self.last = Some(found);
        Some(endpoint)
    }

    fn insert(&mut self, text: &str, endpoint: &Arc<Endpoint>) {
        if self.by_text.len() >= Self::MAX_ENTRIES {
            self.by_text.clear();
        }
        let key: Arc<str> = Arc::from(text);
        self.by_text.insert(Arc::clone(&key), Arc::clone(endpoint));
        self.last = Some((key, Arc::clone(endpoint)));
    }
}

impl StoreClient {
    /// The parsed endpoint of a replica's `transport_endpoint` string.
    pub(super) fn endpoint_of(&self, text: &str) -> Result<Arc<Endpoint>, StoreError> {
        if let Some(endpoint) = self.inner.endpoints.lock().get(text) {
            return Ok(endpoint);
        }
        let endpoint = Arc::new(Endpoint::parse(text)?);
        self.inner.endpoints.lock().insert(text, &endpoint);
        Ok(endpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::{Endpoint, EndpointCache};
    use std::sync::Arc;

    /// The cache answers the endpoint of the string asked, whether it was the last one used or
    /// not, and starts over (forgetting all) once full.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn endpoint_cache_answers_each_string_its_own_endpoint() {
        let text = |i: u64| format!("tcp://127.0.0.1:{}?inst={i:016x}", 1000 + i % 60_000);
        let mut cache = EndpointCache::default();
        assert!(cache.get(&text(1)).is_none());
        for i in 1..=3 {
            let endpoint = Arc::new(Endpoint::parse(&text(i)).unwrap());
            cache.insert(&text(i), &endpoint);
        }
        for i in [3, 3, 1, 2, 2, 1, 3] {
            let got = cache.get(&text(i)).unwrap();
            assert_eq!(got.instance_id(), i);
            assert_eq!(got.tcp_authority(), format!("127.0.0.1:{}", 1000 + i));
        }
        assert!(cache.get(&text(4)).is_none());
        for i in 0..EndpointCache::MAX_ENTRIES as u64 {
            cache.insert(
                &text(10 + i),
                &Arc::new(Endpoint::parse(&text(10 + i)).unwrap()),
            );
        }
        assert!(cache.by_text.len() <= EndpointCache::MAX_ENTRIES);
        assert!(cache.get(&text(1)).is_none(), "a full cache starts over");
    }
}
