//! Value layout: a fixed 10-byte header, then the record as bincode 2 (standard config:
//! little-endian, varint integers).
//!
//! ```text
//! offset 0  4 bytes  MAGIC  b"EnvA"
//! offset 4  2 bytes  schema version, u16 big-endian
//! offset 6  4 bytes  CRC-32 (IEEE) of the payload, u32 big-endian
//! offset 10 …        payload
//! ```
//!
//! Magic and version keep their offsets in every future schema, so an old build reading a newer
//! record reports the version instead of misreading the payload. The CRC catches damage that
//! bincode would otherwise decode into wrong values (a flipped bit in a log-prob).
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::Damage;

/// First four bytes of every value.
pub const MAGIC: [u8; 4] = *b"EnvA";
/// The record schema this build writes and reads. Bump it when any record type changes shape.
pub const SCHEMA_VERSION: u16 = 1;
/// Header length, bytes.
pub const HEADER_LEN: usize = 10;
/// Largest payload bincode may allocate for while decoding, bytes (a damaged length prefix must
/// not trigger a huge allocation; real records are far smaller: 200 rows × 32k tokens ≈ 20 MB).
const DECODE_LIMIT: usize = 1 << 30;

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Why a value could not be decoded.
pub(crate) enum Failure {
    /// The bytes are damaged.
    Damage(Damage),
    /// The header names another schema version.
    Version(u16),
}

/// Encodes `record` behind the header.
pub(crate) fn encode<R: Serialize>(record: &R) -> Result<Vec<u8>, bincode::error::EncodeError> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&SCHEMA_VERSION.to_be_bytes());
    out.extend_from_slice(&[0; 4]);
    bincode::serde::encode_into_std_write(record, &mut out, config())?;
    let crc = crc32fast::hash(&out[HEADER_LEN..]);
    out[6..HEADER_LEN].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

/// Checks a value's header and checksum without decoding it (repair copies values as bytes).
pub(crate) fn check(bytes: &[u8]) -> Result<(), Failure> {
    let Some((header, payload)) = bytes.split_first_chunk::<HEADER_LEN>() else {
        return Err(Failure::Damage(Damage::TooShort {
            len: bytes.len(),
            header: HEADER_LEN,
        }));
    };
    let found = [header[0], header[1], header[2], header[3]];
    if found != MAGIC {
        return Err(Failure::Damage(Damage::BadMagic {
            expected: MAGIC,
            found,
        }));
    }
    let version = u16::from_be_bytes([header[4], header[5]]);
    if version != SCHEMA_VERSION {
        return Err(Failure::Version(version));
    }
    let stored = u32::from_be_bytes([header[6], header[7], header[8], header[9]]);
    let computed = crc32fast::hash(payload);
    if stored != computed {
        return Err(Failure::Damage(Damage::Checksum { stored, computed }));
    }
    Ok(())
}

/// Decodes a value made by [`encode`]: magic, then version, then checksum, then payload.
pub(crate) fn decode<R: DeserializeOwned>(bytes: &[u8]) -> Result<R, Failure> {
    check(bytes)?;
    let payload = &bytes[HEADER_LEN..];
    let (record, used) =
        bincode::serde::decode_from_slice(payload, config().with_limit::<DECODE_LIMIT>())
            .map_err(|e| Failure::Damage(Damage::Decode(e)))?;
    if used != payload.len() {
        return Err(Failure::Damage(Damage::TrailingBytes {
            extra: payload.len() - used,
        }));
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{PolicyVersion, Role, Row};

    fn row() -> Row {
        Row {
            role: Role::Rehearse,
            prompt_ids: vec![1, 300, 49151],
            completion_ids: vec![2],
            logprobs: vec![-0.25],
            policy_version: PolicyVersion(7),
        }
    }

    #[test]
    fn header_layout_and_round_trip() {
        let bytes = encode(&row()).unwrap();
        assert_eq!(&bytes[..4], b"EnvA");
        assert_eq!(&bytes[4..6], &[0, 1]);
        assert_eq!(
            u32::from_be_bytes(bytes[6..10].try_into().unwrap()),
            crc32fast::hash(&bytes[10..])
        );
        let back: Row = decode(&bytes).ok().unwrap();
        assert_eq!(back, row());
    }

    #[test]
    fn each_kind_of_damage_is_named() {
        let good = encode(&row()).unwrap();
        let damage = |bytes: &[u8]| match decode::<Row>(bytes) {
            Err(Failure::Damage(d)) => d.to_string(),
            Err(Failure::Version(v)) => format!("version {v}"),
            Ok(_) => "decoded".to_owned(),
        };
        assert_eq!(
            damage(&good[..5]),
            "value is 5 bytes, shorter than the 10-byte header"
        );
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(damage(&bad).starts_with("value does not start with the magic"));
        let mut bad = good.clone();
        bad[5] = 9;
        assert_eq!(damage(&bad), "version 9");
        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0x40;
        assert!(
            damage(&bad).starts_with("checksum mismatch"),
            "{}",
            damage(&bad)
        );
        // A payload with a valid checksum that is not a Row: the role tag 9 does not exist.
        let mut bad = good[..HEADER_LEN].to_vec();
        bad.push(9);
        let crc = crc32fast::hash(&bad[HEADER_LEN..]);
        bad[6..10].copy_from_slice(&crc.to_be_bytes());
        assert!(
            damage(&bad).starts_with("payload does not decode"),
            "{}",
            damage(&bad)
        );
        let mut bad = good.clone();
        bad.push(0);
        let crc = crc32fast::hash(&bad[HEADER_LEN..]);
        bad[6..10].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(damage(&bad), "1 bytes left after the record");
    }
}
