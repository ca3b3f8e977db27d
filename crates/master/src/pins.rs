//! Soft-pin expiry (as upstream's master): a put with ENABLE and a TTL gets its deadline when its
//! first replica completes ([`MasterService::push_soft_pin`]); [`MasterService::run_soft_pin_expiry_once`]
//! clears the pins whose deadline has passed. The deadline is durable state (in the object's
//! record); the heap is derived from it. Expiry is also checked lazily wherever a pin matters
//! (`soft_pinned(now)`).

use crate::deferred::SoftPinDeadline;
use crate::handle::MasterService;
use crate::index::Tenant;

impl MasterService {
    /// Queues the expiry of `key`'s soft pin at `deadline_ms`.
    pub(crate) fn push_soft_pin(&self, tenant: Tenant<'_>, key: &str, deadline_ms: u64) {
        self.soft_pins.lock().push(SoftPinDeadline {
            deadline_ms,
            tenant: tenant.id(),
            key: Box::from(key),
        });
    }

    /// Clears soft pins whose deadline has passed (the heap pops in deadline order). Returns how
    /// many objects lost their pin.
    pub fn run_soft_pin_expiry_once(&self) -> usize {
        let now = self.clock.now_ms();
        let due = self.soft_pins.lock().pop_due(now);
        let mut cleared = 0;
        for e in due {
            let tenant = Tenant::of(e.tenant.as_ref());
            let hash = self.route(tenant, &e.key);
            let mut shard = self.index.shard(hash).write();
            let hit = self.edit_entry(&mut shard, tenant, hash, &e.key, |meta, edit| {
                if meta.soft_pin_deadline_ms() == e.deadline_ms {
                    meta.set_soft_pin_deadline_ms(0);
                    edit.changed();
                    true
                } else {
                    false
                }
            });
            cleared += usize::from(hit == Some(true));
        }
        cleared
    }

    /// Number of soft-pin deadlines waiting in the heap.
    pub fn pending_soft_pin_deadlines(&self) -> usize {
        self.soft_pins.lock().len()
    }
}
