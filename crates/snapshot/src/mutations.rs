//! One [`Mutation`] as bytes: the payload of an op-log entry (docs/oplog.md, "Mutation
//! encoding"). Objects, segments, discarded entries and quotas use the snapshot's record
//! encodings (docs/snapshot.md, "Records"); a tag byte says which mutation follows.

use mooncake_common::{ClientId, SegmentId, SegmentStatus, TenantId};
use mooncake_master::mutation::{Mutation, SegmentRecord};
use mooncake_master::TenantPolicy;

use crate::records::{self, IdTable};
use crate::wire::{put_str, put_uuid, put_varint, Reader};
use crate::SnapshotError;

/// Tag bytes, one per [`Mutation`] variant.
pub const TAG_OBJECT: u8 = 1;
pub const TAG_ERASE: u8 = 2;
pub const TAG_SEGMENT_MOUNTED: u8 = 3;
pub const TAG_SEGMENT_STATUS: u8 = 4;
pub const TAG_GRACEFUL_UNMOUNT: u8 = 5;
pub const TAG_SEGMENT_UNMOUNTED: u8 = 6;
pub const TAG_TENANT_POLICY: u8 = 7;
pub const TAG_DISCARDED: u8 = 8;
pub const TAG_DISCARDED_RELEASED: u8 = 9;

/// Most tenants one policy record may list.
const MAX_TENANTS: usize = 1 << 20;

/// Appends the encoding of `m` to `out`.
pub fn encode_mutation(out: &mut Vec<u8>, m: &Mutation) {
    match m {
        Mutation::Object(record) => {
            out.push(TAG_OBJECT);
            let mut table = IdTable::default();
            let mut body = Vec::with_capacity(64 + record.key.len());
            records::put_object(&mut body, &mut table, &record.view());
            table.write(out);
            out.extend_from_slice(&body);
        }
        Mutation::Erase { tenant, key } => {
            out.push(TAG_ERASE);
            match tenant {
                None => out.push(0),
                Some(t) => {
                    out.push(1);
                    put_str(out, t.as_str());
                }
            }
            put_str(out, key);
        }
        Mutation::SegmentMounted { segment, client } => {
            out.push(TAG_SEGMENT_MOUNTED);
            records::put_segment(
                out,
                &SegmentRecord {
                    segment: segment.clone(),
                    client: *client,
                    status: SegmentStatus::OK,
                    graceful_deadline_ms: None,
                },
            );
        }
        Mutation::SegmentStatus { id, status } => {
            out.push(TAG_SEGMENT_STATUS);
            put_uuid(out, id.0);
            out.push(status.as_number() as u8);
        }
        Mutation::GracefulUnmount {
            id,
            client,
            deadline_ms,
        } => {
            out.push(TAG_GRACEFUL_UNMOUNT);
            put_uuid(out, id.0);
            put_uuid(out, client.0);
            put_varint(out, *deadline_ms);
        }
        Mutation::SegmentUnmounted { id } => {
            out.push(TAG_SEGMENT_UNMOUNTED);
            put_uuid(out, id.0);
        }
        Mutation::TenantPolicy(policy) => {
            out.push(TAG_TENANT_POLICY);
            put_varint(out, policy.tenants.len() as u64);
            for (t, q) in &policy.tenants {
                records::put_quota(out, t, *q);
            }
        }
        Mutation::Discarded(d) => {
            out.push(TAG_DISCARDED);
            records::put_discarded(out, d);
        }
        Mutation::DiscardedReleased { up_to_ms } => {
            out.push(TAG_DISCARDED_RELEASED);
            put_varint(out, *up_to_ms);
        }
    }
}

/// Decodes one mutation that fills `bytes` exactly. Hostile input gets an error, never a panic
/// or an allocation the input does not justify.
pub fn decode_mutation(bytes: &[u8]) -> Result<Mutation, SnapshotError> {
    let mut r = Reader::new(bytes, "op-log mutation");
    let m = match r.u8()? {
        TAG_OBJECT => {
            let ids = IdTable::read(&mut r)?;
            let mut last_tenant = None;
            Mutation::Object(records::read_object(&mut r, &ids, &mut last_tenant)?)
        }
        TAG_ERASE => {
            let tenant = if r.bool()? {
                let name = r.str()?;
                Some(
                    TenantId::new(name)
                        .map_err(|_| r.err(format!("invalid tenant name {name:?}")))?,
                )
            } else {
                None
            };
            Mutation::Erase {
                tenant,
                key: r.string()?,
            }
        }
        TAG_SEGMENT_MOUNTED => {
            let s = records::read_segment(&mut r)?;
            if s.status != SegmentStatus::OK || s.graceful_deadline_ms.is_some() {
                return Err(r.err("a mounted segment with a status or a graceful deadline"));
            }
            Mutation::SegmentMounted {
                segment: s.segment,
                client: s.client,
            }
        }
        TAG_SEGMENT_STATUS => {
            let id = SegmentId(r.uuid()?);
            let b = r.u8()?;
            let status = SegmentStatus::from_number(i32::from(b))
                .ok_or_else(|| r.err(format!("segment status {b}")))?;
            Mutation::SegmentStatus { id, status }
        }
        TAG_GRACEFUL_UNMOUNT => Mutation::GracefulUnmount {
            id: SegmentId(r.uuid()?),
            client: ClientId(r.uuid()?),
            deadline_ms: r.varint()?,
        },
        TAG_SEGMENT_UNMOUNTED => Mutation::SegmentUnmounted {
            id: SegmentId(r.uuid()?),
        },
        TAG_TENANT_POLICY => Mutation::TenantPolicy(read_policy(&mut r)?),
        TAG_DISCARDED => Mutation::Discarded(records::read_discarded(&mut r)?),
        TAG_DISCARDED_RELEASED => Mutation::DiscardedReleased {
            up_to_ms: r.varint()?,
        },
        t => return Err(r.err(format!("unknown mutation tag {t}"))),
    };
    r.finish()?;
    Ok(m)
}

fn read_policy(r: &mut Reader<'_>) -> Result<TenantPolicy, SnapshotError> {
    // A quota record takes at least 2 bytes (an empty name is refused, a varint).
    let n = r.count(MAX_TENANTS, 2)?;
    let mut policy = TenantPolicy::default();
    for _ in 0..n {
        let (tenant, quota) = records::read_quota(r)?;
        if policy
            .tenants
            .last_key_value()
            .is_some_and(|(last, _)| *last >= tenant)
        {
            return Err(r.err(format!("tenant {tenant} out of order or repeated")));
        }
        policy.tenants.insert(tenant, quota);
    }
    Ok(policy)
}
