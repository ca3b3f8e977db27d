//! Upstream Mooncake's error codes, with their names and numbers.
//!
//! Python callers and logs see these numbers, so they must never change. The list is the one in
//! upstream's `rpc_types`/`types.h`.

use crate::numbered::{upstream_serde, Repr, UpstreamNumber};

macro_rules! error_codes {
    ($( $(#[$doc:meta])* $name:ident = $value:expr ),+ $(,)?) => {
        /// An upstream error code. `OK` (0) is included so that a code can round-trip
        /// through `i32` unchanged; APIs return `Result<T, ErrorCode>` and never `Err(Ok)`.
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(i32)]
        pub enum ErrorCode {
            $( $(#[$doc])* $name = $value, )+
        }

        impl ErrorCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ErrorCode] = &[ $( ErrorCode::$name, )+ ];

            /// The upstream identifier, e.g. `"OBJECT_NOT_FOUND"`.
            pub const fn name(self) -> &'static str {
                match self { $( ErrorCode::$name => stringify!($name), )+ }
            }

            /// The numeric value (`OBJECT_NOT_FOUND` → -704).
            pub const fn as_i32(self) -> i32 {
                self as i32
            }

            /// The code with this number, or `None` for a number upstream does not define.
            pub const fn from_i32(value: i32) -> Option<ErrorCode> {
                match value {
                    $( v if v == $value => Some(ErrorCode::$name), )+
                    _ => None,
                }
            }

            /// The code with this identifier, or `None`.
            pub fn from_name(name: &str) -> Option<ErrorCode> {
                match name {
                    $( stringify!($name) => Some(ErrorCode::$name), )+
                    _ => None,
                }
            }
        }
    };
}

error_codes! {
    OK = 0,
    INTERNAL_ERROR = -1,
    BUFFER_OVERFLOW = -10,
    SHARD_INDEX_OUT_OF_RANGE = -100,
    SEGMENT_NOT_FOUND = -101,
    SEGMENT_ALREADY_EXISTS = -102,
    CLIENT_NOT_FOUND = -103,
    NO_AVAILABLE_HANDLE = -200,
    INVALID_VERSION = -300,
    INVALID_KEY = -400,
    WRITE_FAIL = -500,
    INVALID_PARAMS = -600,
    ILLEGAL_CLIENT = -601,
    INVALID_WRITE = -700,
    INVALID_READ = -701,
    INVALID_REPLICA = -702,
    REPLICA_IS_NOT_READY = -703,
    OBJECT_NOT_FOUND = -704,
    OBJECT_ALREADY_EXISTS = -705,
    OBJECT_HAS_LEASE = -706,
    LEASE_EXPIRED = -707,
    OBJECT_HAS_REPLICATION_TASK = -708,
    OBJECT_NO_REPLICATION_TASK = -709,
    REPLICA_NOT_FOUND = -710,
    REPLICA_ALREADY_EXISTS = -711,
    REPLICA_IS_GONE = -712,
    REPLICA_NOT_IN_LOCAL_MEMORY = -713,
    OBJECT_REPLICA_BUSY = -714,
    TRANSFER_FAIL = -800,
    CHECKSUM_MISMATCH = -801,
    RPC_FAIL = -900,
    RPC_TIMEOUT = -901,
    ETCD_OPERATION_ERROR = -1000,
    ETCD_KEY_NOT_EXIST = -1001,
    ETCD_TRANSACTION_FAIL = -1002,
    ETCD_CTX_CANCELLED = -1003,
    OPLOG_ENTRY_NOT_FOUND = -1004,
    K8S_LEASE_OPERATION_ERROR = -1005,
    K8S_LEASE_NOT_FOUND = -1006,
    INCOMPLETE_OPLOG_CATCH_UP = -1007,
    UNAVAILABLE_IN_CURRENT_STATUS = -1010,
    UNAVAILABLE_IN_CURRENT_MODE = -1011,
    NOT_SUPPORTED = -1012,
    FILE_NOT_FOUND = -1100,
    FILE_OPEN_FAIL = -1101,
    FILE_READ_FAIL = -1102,
    FILE_WRITE_FAIL = -1103,
    FILE_INVALID_BUFFER = -1104,
    FILE_LOCK_FAIL = -1105,
    FILE_INVALID_HANDLE = -1106,
    BUCKET_NOT_FOUND = -1200,
    BUCKET_ALREADY_EXISTS = -1201,
    KEYS_EXCEED_BUCKET_LIMIT = -1202,
    KEYS_ULTRA_LIMIT = -1203,
    UNABLE_OFFLOAD = -1300,
    UNABLE_OFFLOADING = -1301,
    TASK_NOT_FOUND = -1400,
    TASK_PENDING_LIMIT_EXCEEDED = -1401,
    JOB_NOT_FOUND = -1402,
    SERIALIZE_UNSUPPORTED = -1500,
    SERIALIZE_FAIL = -1501,
    DESERIALIZE_FAIL = -1502,
    PERSISTENT_FAIL = -1503,
    DFS_NETWORK_TIMEOUT = -1600,
    DFS_SERVICE_UNAVAILABLE = -1601,
    DFS_QUOTA_EXCEEDED = -1602,
    DFS_PERMISSION_DENIED = -1603,
    DFS_STALE_HANDLE = -1604,
    DFS_PARTIAL_WRITE = -1605,
    TENANT_QUOTA_EXCEEDED = -1700,
    TENANT_NOT_REGISTERED = -1701,
    TENANT_NOT_EMPTY = -1702,
}

/// Serialized as its `i32` (binary formats) or its name (human-readable ones). The set is open:
/// a peer of a newer version may send a code this build does not define, which decodes as
/// `INTERNAL_ERROR` (the answer stays an error; the exact code is lost).
impl UpstreamNumber for ErrorCode {
    const TYPE_NAME: &'static str = "ErrorCode";
    const ALL_VALUES: &'static [Self] = ErrorCode::ALL;
    const FALLBACK: Option<Self> = Some(ErrorCode::INTERNAL_ERROR);
    const REPR: Repr = Repr::I32;

    fn number(self) -> i64 {
        i64::from(self.as_i32())
    }

    fn upstream_name(self) -> &'static str {
        self.name()
    }

    fn with_number(number: i64) -> Option<Self> {
        i32::try_from(number).ok().and_then(ErrorCode::from_i32)
    }

    fn with_name(name: &str) -> Option<Self> {
        ErrorCode::from_name(name)
    }
}

upstream_serde!(ErrorCode);

impl ErrorCode {
    /// True for `OK`.
    pub const fn is_ok(self) -> bool {
        matches!(self, ErrorCode::OK)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.as_i32())
    }
}

impl std::error::Error for ErrorCode {}

impl From<ErrorCode> for i32 {
    fn from(code: ErrorCode) -> i32 {
        code.as_i32()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_match_upstream() {
        assert_eq!(ErrorCode::OBJECT_NOT_FOUND.as_i32(), -704);
        assert_eq!(ErrorCode::NO_AVAILABLE_HANDLE.as_i32(), -200);
        assert_eq!(ErrorCode::OBJECT_REPLICA_BUSY.as_i32(), -714);
        assert_eq!(ErrorCode::RPC_TIMEOUT.as_i32(), -901);
        assert_eq!(ErrorCode::INCOMPLETE_OPLOG_CATCH_UP.as_i32(), -1007);
        assert_eq!(ErrorCode::FILE_WRITE_FAIL.as_i32(), -1103);
        assert_eq!(ErrorCode::TENANT_NOT_EMPTY.as_i32(), -1702);
    }

    #[test]
    fn every_code_round_trips_through_number_and_name() {
        let mut seen = std::collections::HashSet::new();
        for &code in ErrorCode::ALL {
            assert!(
                seen.insert(code.as_i32()),
                "duplicate number {}",
                code.as_i32()
            );
            assert_eq!(ErrorCode::from_i32(code.as_i32()), Some(code));
            assert_eq!(ErrorCode::from_name(code.name()), Some(code));
        }
        assert_eq!(ErrorCode::ALL.len(), 72);
        assert_eq!(ErrorCode::from_i32(-2), None);
        assert_eq!(ErrorCode::from_name("NOPE"), None);
    }

    #[test]
    fn display_shows_name_and_number() {
        assert_eq!(
            ErrorCode::INVALID_PARAMS.to_string(),
            "INVALID_PARAMS (-600)"
        );
    }
}
