//! How many values a frame holds, counted without decoding it: a MessagePack value takes a
//! byte at least and decodes to about 32, so a frame of tiny values (a 64 MiB array of
//! `nil`s) would take 2 GiB to decode. The server counts before it decodes.

use rmp::Marker;

/// The values (every array item, map key and map value, and the outer value) in the
/// MessagePack `body`, if they are at most `max`; `Err` with the count so far past it.
/// Truncated or malformed bytes stop the count: the decoder words that error.
pub fn count_values(body: &[u8], max: usize) -> Result<usize, usize> {
    let mut rest = body;
    // Values still to read: arrays and maps add their items, so no recursion is needed.
    let mut pending: usize = 1;
    let mut count: usize = 0;
    while pending > 0 {
        let Ok(marker) = rmp::decode::read_marker(&mut rest) else {
            break;
        };
        pending -= 1;
        count += 1;
        if count > max {
            return Err(count);
        }
        let skip = match marker {
            Marker::FixArray(n) => {
                pending = pending.saturating_add(usize::from(n));
                0
            }
            Marker::FixMap(n) => {
                pending = pending.saturating_add(2 * usize::from(n));
                0
            }
            Marker::Array16 | Marker::Map16 | Marker::Array32 | Marker::Map32 => {
                let Some(n) = read_len(&mut rest, matches!(marker, Marker::Array16 | Marker::Map16)) else {
                    break;
                };
                let n = match marker {
                    Marker::Map16 | Marker::Map32 => n.saturating_mul(2),
                    _ => n,
                };
                pending = pending.saturating_add(n);
                0
            }
            Marker::FixStr(n) => usize::from(n),
            Marker::Str8 | Marker::Bin8 => match rest.split_first() {
                Some((&n, tail)) => {
                    rest = tail;
                    usize::from(n)
                }
                None => break,
            },
            Marker::Str16 | Marker::Bin16 => match read_len(&mut rest, true) {
                Some(n) => n,
                None => break,
            },
            Marker::Str32 | Marker::Bin32 => match read_len(&mut rest, false) {
                Some(n) => n,
                None => break,
            },
            Marker::U8 | Marker::I8 => 1,
            Marker::U16 | Marker::I16 => 2,
            Marker::U32 | Marker::I32 | Marker::F32 => 4,
            Marker::U64 | Marker::I64 | Marker::F64 => 8,
            Marker::FixExt1 | Marker::FixExt2 | Marker::FixExt4 | Marker::FixExt8 | Marker::FixExt16 => {
                let len = match marker {
                    Marker::FixExt1 => 1,
                    Marker::FixExt2 => 2,
                    Marker::FixExt4 => 4,
                    Marker::FixExt8 => 8,
                    _ => 16,
                };
                ext_body(&mut rest, len, &mut pending)
            }
            Marker::Ext8 | Marker::Ext16 | Marker::Ext32 => {
                let len = match marker {
                    Marker::Ext8 => rest.split_first().map(|(&n, tail)| {
                        rest = tail;
                        usize::from(n)
                    }),
                    Marker::Ext16 => read_len(&mut rest, true),
                    _ => read_len(&mut rest, false),
                };
                match len {
                    Some(n) => ext_body(&mut rest, n, &mut pending),
                    None => break,
                }
            }
            _ => 0, // nil, booleans, fixints, reserved
        };
        if skip > rest.len() {
            break;
        }
        rest = &rest[skip..];
    }
    Ok(count)
}

/// The ext type of a tuple, whose body is one MessagePack value (an array) that the server
/// decodes (to stamp the pickles in it, to hash it as a key).
const EXT_TUPLE: u8 = 3;

/// After an ext value's header, at its type byte: the bytes to skip. A tuple's body is
/// counted as the value it holds, read next (inline: tuples nest without recursion here);
/// any other ext's body is opaque.
fn ext_body(rest: &mut &[u8], len: usize, pending: &mut usize) -> usize {
    match rest.split_first() {
        Some((&EXT_TUPLE, tail)) => {
            *rest = tail;
            *pending = pending.saturating_add(1);
            0
        }
        _ => len.saturating_add(1), // and the type byte
    }
}

/// A big-endian length of 2 (`short`) or 4 bytes.
fn read_len(rest: &mut &[u8], short: bool) -> Option<usize> {
    let width = if short { 2 } else { 4 };
    if rest.len() < width {
        return None;
    }
    let (bytes, tail) = rest.split_at(width);
    *rest = tail;
    Some(bytes.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value;

    fn encode(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, value).unwrap();
        out
    }

    #[test]
    fn every_item_key_and_value_is_counted() {
        let value = Value::Array(vec![
            Value::from(1),
            Value::from("text"),
            Value::Binary(vec![0; 300]),
            Value::Map(vec![(Value::from("k"), Value::Array(vec![Value::Nil; 70_000]))]),
            Value::Ext(4, vec![1, 2, 3]),
            Value::F64(1.5),
            Value::from(u64::MAX),
        ]);
        // the outer array, its 7 items, the map's key and value, and the value's 70,000 nils
        assert_eq!(count_values(&encode(&value), usize::MAX), Ok(1 + 7 + 2 + 70_000));
    }

    #[test]
    fn a_tuples_items_are_counted_however_deep_it_nests() {
        let tuple = |items: Vec<Value>| Value::Ext(EXT_TUPLE as i8, encode(&Value::Array(items)));
        // The tuple, its array and 70,000 nils (its body is decoded by the server).
        let flat = tuple(vec![Value::Nil; 70_000]);
        assert_eq!(count_values(&encode(&flat), usize::MAX), Ok(1 + 1 + 70_000));
        // A tuple in a tuple ... 10,000 deep: counted without recursion.
        let mut deep = tuple(vec![]);
        for _ in 0..10_000 {
            deep = tuple(vec![deep]);
        }
        assert_eq!(count_values(&encode(&deep), usize::MAX), Ok(2 * 10_001));
        // Small tuples count too; other ext types stay opaque.
        let small = Value::Array(vec![
            tuple(vec![Value::Nil]),
            Value::Ext(4, encode(&Value::Array(vec![Value::Nil; 9]))),
        ]);
        assert_eq!(count_values(&encode(&small), usize::MAX), Ok(1 + 3 + 1));
    }

    #[test]
    fn counting_stops_past_the_limit() {
        let nils = encode(&Value::Array(vec![Value::Nil; 1000]));
        assert_eq!(count_values(&nils, 1001), Ok(1001));
        assert_eq!(count_values(&nils, 100), Err(101));
    }

    #[test]
    fn a_claimed_count_past_the_bytes_is_not_believed() {
        // An array32 claiming 4 billion items, with none following.
        let body = [0xdd, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(count_values(&body, 10), Ok(1));
        // Truncated strings and lengths stop the count too.
        assert_eq!(count_values(&[0xdb, 0, 0], 10), Ok(1));
        assert_eq!(count_values(&[0x92, 0xa5, b'a'], 10), Ok(2));
    }
}
