//! JSON ↔ MessagePack values (docs/http.md, "Values").
//!
//! JSON has no bytes, no non-string map keys, no NaN and no extension types, which objects
//! may hold (a `Blob`, a `Dict` keyed by numbers, a pickled Python value). Each travels in
//! a one-key wrapper object whose key starts with `$`, the same in both directions, so a
//! value read over HTTP can be written back unchanged:
//!
//! | MessagePack | JSON |
//! |-------------|------|
//! | nil, bool, int, str, array | null, bool, number, string, array |
//! | float | number; NaN and ±infinity as `{"$float": "nan" \| "inf" \| "-inf"}` |
//! | map, every key a str | object |
//! | map with other keys | `{"$map": [[key, value], ...]}` |
//! | bin | `{"$bytes": "<base64>"}` |
//! | ext | `{"$ext": [type, "<base64>"]}` |
//!
//! An object of one key that starts with `$` but is none of these is refused rather than
//! taken as a map (a typo would otherwise be stored silently); a map with such a key is
//! written as `{"$map": ...}`.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::{Map, Number, Value as Json};
use spindle_core::{Error, Value};

/// Deeper than this, a JSON document is refused (serde_json stops at 128 itself).
const MAX_DEPTH: usize = 128;

/// The MessagePack value of a JSON value.
pub(crate) fn to_value(json: Json) -> Result<Value, Error> {
    to_value_at(json, 0)
}

fn to_value_at(json: Json, depth: usize) -> Result<Value, Error> {
    if depth > MAX_DEPTH {
        return Err(Error::bad_args(format!("values nest {MAX_DEPTH} levels deep at most")));
    }
    Ok(match json {
        Json::Null => Value::Nil,
        Json::Bool(b) => Value::Boolean(b),
        Json::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => Value::from(u),
            (_, Some(i), _) => Value::from(i),
            (_, _, Some(f)) => Value::F64(f),
            _ => return Err(Error::bad_args(format!("number {n} is out of range"))),
        },
        Json::String(s) => Value::from(s),
        Json::Array(items) => Value::Array(
            items
                .into_iter()
                .map(|item| to_value_at(item, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        Json::Object(map) => match wrapper(&map).map(str::to_string) {
            Some(key) => unwrap(&key, map, depth)?,
            None => Value::Map(
                map.into_iter()
                    .map(|(k, v)| Ok((Value::from(k), to_value_at(v, depth + 1)?)))
                    .collect::<Result<_, Error>>()?,
            ),
        },
    })
}

/// The key of a one-key object whose key starts with `$` (a wrapper, or a mistake).
fn wrapper(map: &Map<String, Json>) -> Option<&str> {
    match map.len() {
        1 => map.keys().next().map(String::as_str).filter(|k| k.starts_with('$')),
        _ => None,
    }
}

fn unwrap(key: &str, map: Map<String, Json>, depth: usize) -> Result<Value, Error> {
    let inner = map.into_iter().next().map(|(_, v)| v).unwrap_or(Json::Null);
    let bad = |what: &str| Error::bad_args(format!("{{\"{key}\": ...}} holds {what}"));
    match (key, inner) {
        ("$bytes", Json::String(b64)) => Ok(Value::Binary(decode(&b64).map_err(|_| bad("base64 text"))?)),
        ("$float", Json::String(f)) => match f.as_str() {
            "nan" => Ok(Value::F64(f64::NAN)),
            "inf" => Ok(Value::F64(f64::INFINITY)),
            "-inf" => Ok(Value::F64(f64::NEG_INFINITY)),
            _ => Err(bad("\"nan\", \"inf\" or \"-inf\"")),
        },
        ("$map", Json::Array(pairs)) => {
            let mut entries = Vec::with_capacity(pairs.len());
            for pair in pairs {
                match pair {
                    Json::Array(kv) if kv.len() == 2 => {
                        let mut kv = kv.into_iter();
                        let (k, v) = (kv.next().unwrap_or_default(), kv.next().unwrap_or_default());
                        entries.push((to_value_at(k, depth + 1)?, to_value_at(v, depth + 1)?));
                    }
                    _ => return Err(bad("[key, value] pairs")),
                }
            }
            Ok(Value::Map(entries))
        }
        ("$ext", Json::Array(parts)) => match parts.as_slice() {
            [Json::Number(t), Json::String(b64)] => {
                let t = t
                    .as_i64()
                    .and_then(|t| i8::try_from(t).ok())
                    .ok_or_else(|| bad("a type from -128 to 127"))?;
                Ok(Value::Ext(t, decode(b64).map_err(|_| bad("base64 text"))?))
            }
            _ => Err(bad("[type, base64]")),
        },
        ("$bytes" | "$float" | "$map" | "$ext", _) => Err(bad("a value of the wrong JSON type")),
        _ => Err(Error::bad_args(format!(
            "unknown wrapper {{\"{key}\": ...}} (known: $bytes, $float, $map, $ext)"
        ))),
    }
}

fn decode(b64: &str) -> Result<Vec<u8>, base64::DecodeError> {
    BASE64.decode(b64.as_bytes())
}

/// The JSON value of a MessagePack value.
pub(crate) fn to_json(value: &Value) -> Json {
    match value {
        Value::Nil => Json::Null,
        Value::Boolean(b) => Json::Bool(*b),
        Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => Json::from(u),
            (_, Some(i)) => Json::from(i),
            _ => Json::Null,
        },
        Value::F32(f) => float(f64::from(*f)),
        Value::F64(f) => float(*f),
        Value::String(s) => match s.as_str() {
            Some(s) => Json::from(s),
            // Not UTF-8: its bytes, as MessagePack carried them.
            None => wrapped("$bytes", Json::from(BASE64.encode(s.as_bytes()))),
        },
        Value::Binary(b) => wrapped("$bytes", Json::from(BASE64.encode(b))),
        Value::Array(items) => Json::Array(items.iter().map(to_json).collect()),
        Value::Map(entries) => {
            let plain = entries.iter().all(|(k, _)| k.as_str().is_some());
            let object: Option<Map<String, Json>> = plain.then(|| {
                entries
                    .iter()
                    .filter_map(|(k, v)| Some((k.as_str()?.to_string(), to_json(v))))
                    .collect()
            });
            // Also when keys repeat (an object would drop some), or it would read as a wrapper.
            match object.filter(|o| o.len() == entries.len() && wrapper(o).is_none()) {
                Some(object) => Json::Object(object),
                None => wrapped(
                    "$map",
                    Json::Array(
                        entries
                            .iter()
                            .map(|(k, v)| Json::Array(vec![to_json(k), to_json(v)]))
                            .collect(),
                    ),
                ),
            }
        }
        Value::Ext(t, data) => wrapped(
            "$ext",
            Json::Array(vec![Json::from(*t), Json::from(BASE64.encode(data))]),
        ),
    }
}

fn float(f: f64) -> Json {
    match Number::from_f64(f) {
        Some(n) => Json::Number(n),
        None if f.is_nan() => wrapped("$float", Json::from("nan")),
        None if f > 0.0 => wrapped("$float", Json::from("inf")),
        None => wrapped("$float", Json::from("-inf")),
    }
}

fn wrapped(key: &str, inner: Json) -> Json {
    let mut map = Map::new();
    map.insert(key.to_string(), inner);
    Json::Object(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(value: Value) {
        let json = to_json(&value);
        let text = serde_json::to_string(&json).unwrap();
        let back = to_value(serde_json::from_str(&text).unwrap()).unwrap();
        assert_eq!(format!("{back:?}"), format!("{value:?}"), "through {text}");
    }

    #[test]
    fn every_kind_of_value_survives_the_round_trip() {
        round_trip(Value::Nil);
        round_trip(Value::Boolean(true));
        round_trip(Value::from(-5i64));
        round_trip(Value::from(u64::MAX));
        round_trip(Value::F64(1.5));
        round_trip(Value::F64(f64::INFINITY));
        round_trip(Value::from("text"));
        round_trip(Value::Binary(vec![0, 159, 255]));
        round_trip(Value::Ext(3, vec![1, 2]));
        round_trip(Value::Array(vec![Value::from(1), Value::from("a")]));
        round_trip(Value::Map(vec![(Value::from("a"), Value::from(1))]));
        round_trip(Value::Map(vec![(Value::from(1), Value::from("one"))]));
        // A str-keyed map that looks like a wrapper stays a map.
        round_trip(Value::Map(vec![(Value::from("$bytes"), Value::from("x"))]));
    }

    #[test]
    fn plain_json_reads_as_expected() {
        let value = to_value(serde_json::json!({"n": 3, "bytes": {"$bytes": "AAE="}})).unwrap();
        let Value::Map(entries) = value else {
            panic!("not a map")
        };
        let bytes = entries.iter().find(|(k, _)| k.as_str() == Some("bytes"));
        assert_eq!(bytes.map(|(_, v)| v), Some(&Value::Binary(vec![0, 1])));
    }

    #[test]
    fn malformed_wrappers_are_refused() {
        for bad in [
            serde_json::json!({"$bytes": "not base64!"}),
            serde_json::json!({"$bytes": 3}),
            serde_json::json!({"$map": [[1]]}),
            serde_json::json!({"$nope": 1}),
        ] {
            assert!(to_value(bad.clone()).is_err(), "{bad} accepted");
        }
    }
}
