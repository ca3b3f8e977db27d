//! Writer ids interned to 4 bytes: an object keeps the [`WriterId`] of the client that wrote it
//! instead of its 16-byte [`ClientId`] (see docs/master.md, "Memory per object").
//!
//! One table per process, shared by every master in it: interning is a pure function of the
//! client id (the same id always gets the same index), so sharing changes no answer. The table
//! only grows (a master meets a few clients per host over its life; each costs about 40 bytes).
//! Lookups take a read lock; only a client's first write takes the write lock.

use std::collections::HashMap;

use mooncake_common::ClientId;
use parking_lot::RwLock;

/// A client interned in the process's writer table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WriterId(u32);

#[derive(Default)]
struct Table {
    ids: Vec<ClientId>,
    index: HashMap<ClientId, u32, foldhash::fast::RandomState>,
}

static TABLE: RwLock<Option<Table>> = RwLock::new(None);

impl WriterId {
    /// The id of `client`, interned on first use.
    pub fn of(client: ClientId) -> WriterId {
        if let Some(id) = Self::find(client) {
            return id;
        }
        let mut guard = TABLE.write();
        let table = guard.get_or_insert_with(Table::default);
        if let Some(&i) = table.index.get(&client) {
            return WriterId(i);
        }
        // 2^32 distinct writers would take the table past 150 GiB first; past that every new
        // client shares the last id, which names no client.
        let Ok(i) = u32::try_from(table.ids.len()) else {
            return WriterId(u32::MAX);
        };
        table.ids.push(client);
        table.index.insert(client, i);
        WriterId(i)
    }

    /// The id of `client` if it was ever interned (a client that never wrote has none).
    pub fn find(client: ClientId) -> Option<WriterId> {
        let guard = TABLE.read();
        let table = guard.as_ref()?;
        table.index.get(&client).map(|&i| WriterId(i))
    }

    /// The client this id stands for.
    pub fn client(self) -> ClientId {
        let guard = TABLE.read();
        guard
            .as_ref()
            .and_then(|t| t.ids.get(self.0 as usize).copied())
            .unwrap_or_default()
    }

    /// Whether this id stands for `client`.
    pub fn is(self, client: ClientId) -> bool {
        self.client() == client
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_is_stable_and_round_trips() {
        let a = ClientId::new(0x77, 1);
        let b = ClientId::new(0x77, 2);
        let (wa, wb) = (WriterId::of(a), WriterId::of(b));
        assert_ne!(wa, wb);
        assert_eq!(WriterId::of(a), wa);
        assert_eq!(WriterId::find(b), Some(wb));
        assert_eq!(WriterId::find(ClientId::new(0x77, 3)), None);
        assert_eq!(wa.client(), a);
        assert!(wb.is(b) && !wb.is(a));
    }
}
