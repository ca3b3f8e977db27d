//! A standby's replay: batches applied to a master in sequence order. A batch entirely at or
//! below the applied sequence is a duplicate and changes nothing; a batch that overlaps it is
//! applied from the first entry not yet applied; a batch that starts past the next expected
//! sequence is a gap, and a batch that does not verify is corrupt. Either halts the replayer for
//! good: it never skips, and every later call answers the same error.

use mooncake_master::MasterService;

use crate::batch::{self, Batch};
use crate::OpLogError;

/// Applies batches to `master` (see the module doc).
#[derive(Debug)]
pub struct Replayer<'a> {
    master: &'a MasterService,
    applied_seq: u64,
    halted: Option<OpLogError>,
}

impl<'a> Replayer<'a> {
    /// A replayer whose master holds everything up to `applied_seq` (0 for an empty master, a
    /// snapshot's op-log position after a restore).
    pub fn new(master: &'a MasterService, applied_seq: u64) -> Self {
        Replayer {
            master,
            applied_seq,
            halted: None,
        }
    }

    /// The last sequence number applied.
    pub fn applied_seq(&self) -> u64 {
        self.applied_seq
    }

    /// The error that halted replay, if any.
    pub fn halted(&self) -> Option<&OpLogError> {
        self.halted.as_ref()
    }

    /// Verifies, decodes and applies one batch as it was stored. Returns the entries applied.
    pub fn apply_bytes(&mut self, bytes: &[u8]) -> Result<usize, OpLogError> {
        self.check_halted()?;
        match batch::decode(bytes) {
            Ok(b) => self.apply(&b),
            Err(e) => Err(self.halt(e)),
        }
    }

    /// Applies one decoded batch. Returns the entries applied (0 for a duplicate).
    pub fn apply(&mut self, b: &Batch) -> Result<usize, OpLogError> {
        self.check_halted()?;
        if b.mutations.is_empty() || b.last_seq() <= self.applied_seq {
            return Ok(0);
        }
        let expected = self.applied_seq + 1;
        if b.first_seq > expected {
            return Err(self.halt(OpLogError::Gap {
                expected,
                found: b.first_seq,
            }));
        }
        let skip = (expected - b.first_seq) as usize;
        let mut applied = 0;
        for m in &b.mutations[skip..] {
            if let Err(e) = self.master.apply(m) {
                let seq = self.applied_seq + 1;
                return Err(self.halt(OpLogError::Apply {
                    seq,
                    reason: e.to_string(),
                }));
            }
            self.applied_seq += 1;
            applied += 1;
        }
        Ok(applied)
    }

    fn check_halted(&self) -> Result<(), OpLogError> {
        match &self.halted {
            Some(e) => Err(OpLogError::Halted(Box::new(e.clone()))),
            None => Ok(()),
        }
    }

    fn halt(&mut self, e: OpLogError) -> OpLogError {
        self.halted = Some(e.clone());
        e
    }
}
