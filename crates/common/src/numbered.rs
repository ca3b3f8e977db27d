//! Enums that stand for one of upstream's numbers, and how serde carries them.
//!
//! A derived `Serialize` writes a unit enum as its *declaration index*, so inserting a variant
//! would silently renumber the wire. Every enum of this crate that mirrors an upstream numeric
//! value (`ErrorCode`, `ReplicaType`, `ReplicaStatus`, `SegmentStatus`, `ClientStatus`,
//! `TaskType`, `TaskStatus`, `SoftPinAction`) implements [`UpstreamNumber`] instead and is
//! serialized by [`serialize`]/[`deserialize`]:
//!
//! - binary formats (postcard on the master RPC): upstream's number, as the type's integer
//!   (`i32`: a zigzag varint in postcard; `u8`: one raw byte);
//! - human-readable formats (JSON, YAML): upstream's name, e.g. `"OBJECT_NOT_FOUND"`; decoding
//!   also accepts the number.
//!
//! A number or name the type does not define is refused with a decode error, except for types
//! with a [`UpstreamNumber::FALLBACK`] (error codes: a newer peer may send a code this build does
//! not know; it decodes as the fallback, `INTERNAL_ERROR`, so an error stays an error). Binary
//! formats may drop the error message (postcard does); the refused value is kept per thread for
//! the codec to report ([`take_refused`]).

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Visitor};
use serde::{Deserializer, Serializer};

/// The integer type an enum travels as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr {
    /// `i32` (postcard: zigzag varint).
    I32,
    /// `u8` (postcard: one byte).
    U8,
}

/// An enum whose values are upstream's numbers.
pub trait UpstreamNumber: Copy + Sized + 'static {
    /// The type's name, for error messages.
    const TYPE_NAME: &'static str;
    /// Every value, in declaration order.
    const ALL_VALUES: &'static [Self];
    /// What an undefined number decodes to; `None` refuses it.
    const FALLBACK: Option<Self> = None;
    /// The integer type on the wire.
    const REPR: Repr;

    /// Upstream's number.
    fn number(self) -> i64;
    /// Upstream's identifier, e.g. `"MEMORY"`.
    fn upstream_name(self) -> &'static str;

    /// The value with upstream's number, if the type defines it.
    fn with_number(number: i64) -> Option<Self> {
        Self::ALL_VALUES
            .iter()
            .copied()
            .find(|v| v.number() == number)
    }

    /// The value with upstream's identifier, if the type defines it.
    fn with_name(name: &str) -> Option<Self> {
        Self::ALL_VALUES
            .iter()
            .copied()
            .find(|v| v.upstream_name() == name)
    }
}

/// A number or name that a decoder refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub type_name: &'static str,
    /// What was refused: `number 5` or `name "DONE"`.
    pub value: String,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown {} {}", self.type_name, self.value)
    }
}

thread_local! {
    static REFUSED: Cell<Option<Refused>> = const { Cell::new(None) };
}

/// The value most recently refused on this thread, if any, and forgets it. A codec calls it
/// before decoding (to drop a stale one) and after a failed decode (to name the cause).
pub fn take_refused() -> Option<Refused> {
    REFUSED.with(Cell::take)
}

fn refuse<T: UpstreamNumber, E: de::Error>(value: String) -> E {
    let refused = Refused {
        type_name: T::TYPE_NAME,
        value,
    };
    let error = E::custom(&refused);
    REFUSED.with(|r| r.set(Some(refused)));
    error
}

/// Serializes `value`: its number in binary formats, its name in human-readable ones.
pub fn serialize<T: UpstreamNumber, S: Serializer>(value: T, s: S) -> Result<S::Ok, S::Error> {
    if s.is_human_readable() {
        return s.serialize_str(value.upstream_name());
    }
    match T::REPR {
        // The numbers were declared with these types, so the casts are exact.
        Repr::I32 => s.serialize_i32(value.number() as i32),
        Repr::U8 => s.serialize_u8(value.number() as u8),
    }
}

/// Deserializes what [`serialize`] writes (a human-readable format also accepts the number).
pub fn deserialize<'de, T: UpstreamNumber, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
    let visitor = NumberVisitor::<T>(PhantomData);
    if d.is_human_readable() {
        return d.deserialize_any(visitor);
    }
    match T::REPR {
        Repr::I32 => d.deserialize_i32(visitor),
        Repr::U8 => d.deserialize_u8(visitor),
    }
}

struct NumberVisitor<T>(PhantomData<T>);

impl<T: UpstreamNumber> NumberVisitor<T> {
    fn number<E: de::Error>(number: i64) -> Result<T, E> {
        match T::with_number(number).or(T::FALLBACK) {
            Some(v) => Ok(v),
            None => Err(refuse::<T, E>(format!("number {number}"))),
        }
    }
}

impl<T: UpstreamNumber> Visitor<'_> for NumberVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "an upstream {} number or name", T::TYPE_NAME)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        Self::number(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        match i64::try_from(v) {
            Ok(v) => Self::number(v),
            Err(_) => T::FALLBACK.ok_or_else(|| refuse::<T, E>(format!("number {v}"))),
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        T::with_name(v).ok_or_else(|| refuse::<T, E>(format!("name {v:?}")))
    }
}

/// Implements `Serialize`/`Deserialize` of an [`UpstreamNumber`] type through this module.
macro_rules! upstream_serde {
    ($name:ident) => {
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                $crate::numbered::serialize(*self, s)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                $crate::numbered::deserialize(d)
            }
        }
    };
}
pub(crate) use upstream_serde;

/// Declares an enum of upstream numbers with `VALUES`, `as_number`, `from_number`, `name`,
/// [`UpstreamNumber`] and serde through this module. A variant's upstream name defaults to its
/// identifier; `=> "NAME"` gives another.
macro_rules! numbered_enum {
    (
        $(#[$doc:meta])*
        $name:ident : $repr:ident ($wire:ident) {
            $( $(#[$vdoc:meta])* $variant:ident = $value:literal $(=> $uname:literal)? ),+ $(,)?
        }
    ) => {
        $(#[$doc])*
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr($repr)]
        pub enum $name {
            $( $(#[$vdoc])* $variant = $value, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const VALUES: &'static [$name] = &[ $( $name::$variant, )+ ];

            /// Upstream's number.
            pub const fn as_number(self) -> $repr {
                self as $repr
            }

            /// The value with upstream's number, if any.
            pub const fn from_number(value: $repr) -> Option<Self> {
                match value {
                    $( $value => Some($name::$variant), )+
                    _ => None,
                }
            }

            /// Upstream's identifier.
            pub const fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $crate::numbered::numbered_enum!(@name $variant $($uname)?), )+
                }
            }
        }

        impl $crate::numbered::UpstreamNumber for $name {
            const TYPE_NAME: &'static str = stringify!($name);
            const ALL_VALUES: &'static [Self] = $name::VALUES;
            const REPR: $crate::numbered::Repr = $crate::numbered::Repr::$wire;

            fn number(self) -> i64 {
                i64::from(self.as_number())
            }

            fn upstream_name(self) -> &'static str {
                self.name()
            }

            fn with_number(number: i64) -> Option<Self> {
                <$repr>::try_from(number).ok().and_then($name::from_number)
            }
        }

        $crate::numbered::upstream_serde!($name);
    };
    (@name $variant:ident) => { stringify!($variant) };
    (@name $variant:ident $uname:literal) => { $uname };
}
pub(crate) use numbered_enum;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{ClientStatus, ErrorCode, ReplicaStatus, ReplicaType, SegmentStatus};
    use crate::{SoftPinAction, TaskStatus, TaskType};

    fn check_all<T: UpstreamNumber + PartialEq + fmt::Debug>() {
        let mut numbers = std::collections::HashSet::new();
        let mut names = std::collections::HashSet::new();
        for &v in T::ALL_VALUES {
            assert!(
                numbers.insert(v.number()),
                "{} repeats a number",
                T::TYPE_NAME
            );
            assert!(
                names.insert(v.upstream_name()),
                "{} repeats a name",
                T::TYPE_NAME
            );
            assert_eq!(T::with_number(v.number()), Some(v));
            assert_eq!(T::with_name(v.upstream_name()), Some(v));
        }
    }

    #[test]
    fn numbers_and_names_are_unique_and_invertible() {
        check_all::<ErrorCode>();
        check_all::<ReplicaType>();
        check_all::<ReplicaStatus>();
        check_all::<SegmentStatus>();
        check_all::<ClientStatus>();
        check_all::<TaskType>();
        check_all::<TaskStatus>();
        check_all::<SoftPinAction>();
    }

    #[test]
    fn json_carries_names_and_accepts_numbers() {
        let text = serde_json::to_string(&ReplicaType::DFS).unwrap();
        assert_eq!(text, r#""DFS""#);
        assert_eq!(
            serde_json::from_str::<ReplicaType>("100").unwrap(),
            ReplicaType::DFS
        );
        assert_eq!(
            serde_json::to_string(&TaskStatus::Failed).unwrap(),
            r#""FAILED""#
        );
        assert_eq!(
            serde_json::from_str::<TaskStatus>("2").unwrap(),
            TaskStatus::Failed
        );
        assert_eq!(
            serde_json::to_string(&SoftPinAction::Enable).unwrap(),
            r#""ENABLE""#
        );
        assert_eq!(
            serde_json::from_str::<ErrorCode>(r#""OBJECT_NOT_FOUND""#).unwrap(),
            ErrorCode::OBJECT_NOT_FOUND
        );
        assert_eq!(
            serde_json::from_str::<ErrorCode>("-704").unwrap(),
            ErrorCode::OBJECT_NOT_FOUND
        );
    }

    #[test]
    fn unknown_values_are_refused_with_the_type_named() {
        let _ = take_refused();
        let err = serde_json::from_str::<ReplicaType>("5").unwrap_err();
        assert!(
            err.to_string().contains("unknown ReplicaType number 5"),
            "{err}"
        );
        assert_eq!(
            take_refused(),
            Some(Refused {
                type_name: "ReplicaType",
                value: "number 5".into()
            })
        );
        assert_eq!(take_refused(), None, "taken once");
        let err = serde_json::from_str::<TaskStatus>(r#""DONE""#).unwrap_err();
        assert!(
            err.to_string()
                .contains(r#"unknown TaskStatus name "DONE""#),
            "{err}"
        );
        assert!(serde_json::from_str::<SoftPinAction>("3").is_err());
        assert!(serde_json::from_str::<ErrorCode>(r#""NOPE""#).is_err());
    }

    #[test]
    fn unknown_error_numbers_decode_as_internal_error() {
        assert_eq!(
            serde_json::from_str::<ErrorCode>("-99999").unwrap(),
            ErrorCode::INTERNAL_ERROR
        );
        assert_eq!(take_refused(), None, "a fallback is not a refusal");
    }
}
