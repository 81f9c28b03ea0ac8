//! `Array`: a typed n-dimensional array of numbers, updated element-wise in the server.
//!
//! Elements are stored typed (not as MessagePack values); the wire form is the ndarray map
//! `{"dtype", "shape", "data"}` with `data` little-endian in C order.

use super::snapshot::{self, Fields};
use crate::object::args;
use crate::value::type_of;
use crate::{Ctx, Error, ErrorKind, Object, Step, Value};

/// Refuse arrays above this many elements: a typo in a shape must not eat the server's memory.
const MAX_ELEMENTS: u64 = 1 << 31;

/// The most bytes an array holds: an op-log record's, and a frame's by default. `set` and
/// `add` take the whole array in one frame, so a larger one could only ever hold zeros, and
/// a 40-byte `create` would take gigabytes (16 GiB at `MAX_ELEMENTS`, and as much again for
/// each `get`), past `--max-memory` by far more than the one frame a call may add.
const MAX_BYTES: usize = 64 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dtype {
    F64,
    F32,
    I64,
}

impl Dtype {
    fn parse(method: &str, a: &[Value], i: usize) -> Result<Dtype, Error> {
        match args::str(method, a, i, "dtype")? {
            "float64" => Ok(Dtype::F64),
            "float32" => Ok(Dtype::F32),
            "int64" => Ok(Dtype::I64),
            other => Err(Error::value(format!(
                "{method}(): unsupported dtype '{other}' (expected float64, float32 or int64)"
            ))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Dtype::F64 => "float64",
            Dtype::F32 => "float32",
            Dtype::I64 => "int64",
        }
    }

    fn item_size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F64 | Dtype::I64 => 8,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Data {
    F64(Vec<f64>),
    F32(Vec<f32>),
    I64(Vec<i64>),
}

impl Data {
    fn zeros(dtype: Dtype, n: usize) -> Data {
        match dtype {
            Dtype::F64 => Data::F64(vec![0.0; n]),
            Dtype::F32 => Data::F32(vec![0.0; n]),
            Dtype::I64 => Data::I64(vec![0; n]),
        }
    }

    fn dtype(&self) -> Dtype {
        match self {
            Data::F64(_) => Dtype::F64,
            Data::F32(_) => Dtype::F32,
            Data::I64(_) => Dtype::I64,
        }
    }

    /// Decode little-endian `bytes` of dtype `src` straight into `target` (NumPy's `astype`:
    /// floats to int64 truncate, saturating; NaN becomes 0).
    fn decode(src: Dtype, bytes: &[u8], target: Dtype) -> Data {
        let n = src.item_size();
        let f64s = || {
            bytes.chunks_exact(n).map(move |c| match src {
                Dtype::F64 => f64::from_le_bytes(c.try_into().unwrap_or([0; 8])),
                Dtype::F32 => f64::from(f32::from_le_bytes(c.try_into().unwrap_or([0; 4]))),
                Dtype::I64 => i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64,
            })
        };
        match (src, target) {
            (Dtype::I64, Dtype::I64) => Data::I64(
                bytes
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                    .collect(),
            ),
            (Dtype::F32, Dtype::F32) => Data::F32(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4])))
                    .collect(),
            ),
            (_, Dtype::F64) => Data::F64(f64s().collect()),
            (_, Dtype::F32) => Data::F32(f64s().map(|x| x as f32).collect()),
            (_, Dtype::I64) => Data::I64(f64s().map(|x| x as i64).collect()),
        }
    }

    fn len(&self) -> usize {
        match self {
            Data::F64(v) => v.len(),
            Data::F32(v) => v.len(),
            Data::I64(v) => v.len(),
        }
    }

    fn encode(&self) -> Vec<u8> {
        match self {
            Data::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
}

/// A scalar argument: integers stay exact for int64 arrays.
#[derive(Clone, Copy)]
enum Scalar {
    Int(i64),
    Float(f64),
}

impl Scalar {
    fn parse(method: &str, a: &[Value], i: usize, name: &str) -> Result<Scalar, Error> {
        match args::get(a, i) {
            Value::Integer(n) => match n.as_i64() {
                Some(n) => Ok(Scalar::Int(n)),
                None => Ok(Scalar::Float(n.as_f64().unwrap_or(0.0))),
            },
            _ => args::float(method, a, i, name).map(Scalar::Float),
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            Scalar::Int(n) => n as f64,
            Scalar::Float(x) => x,
        }
    }

    /// The integer an int64 array can combine with; NumPy refuses to cast a float in place.
    fn as_i64(self, method: &str) -> Result<i64, Error> {
        match self {
            Scalar::Int(n) => Ok(n),
            Scalar::Float(_) => Err(Error::bad_args(format!(
                "{method}(): an int64 array takes a signed 64-bit integer (not a float)"
            ))),
        }
    }
}

#[derive(Clone)]
pub struct Array {
    shape: Vec<u64>,
    data: Data,
}

fn show_shape(shape: &[u64]) -> String {
    match shape {
        [n] => format!("({n},)"),
        _ => format!(
            "({})",
            shape.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Parse a shape (an int or an array of non-negative ints) and return it with its size.
fn parse_shape(method: &str, v: &Value) -> Result<(Vec<u64>, usize), Error> {
    let dim = |d: &Value| match d {
        Value::Integer(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Ok(u),
            (None, Some(_)) => Err(Error::value("negative dimensions are not allowed")),
            _ => Err(Error::value("array is too big")),
        },
        other => Err(Error::bad_args(format!(
            "{method}(): shape dimensions must be integers, not {}",
            type_of(other)
        ))),
    };
    let shape = match v {
        Value::Array(dims) => dims.iter().map(dim).collect::<Result<Vec<_>, _>>()?,
        Value::Integer(_) => vec![dim(v)?],
        other => {
            return Err(Error::bad_args(format!(
                "{method}(): shape must be an int or an array of ints, not {}",
                type_of(other)
            )))
        }
    };
    let size = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| {
            Error::value(format!(
                "array is too big: shape {} has more than 2^31 elements",
                show_shape(&shape)
            ))
        })?;
    Ok((shape, size as usize))
}

/// An ndarray map from the wire, checked: its shape, and its elements converted to `target`.
fn parse_ndarray(method: &str, v: &Value, target: Dtype) -> Result<(Vec<u64>, Data), Error> {
    let bad = || Error::bad_args(format!("{method}(): expected an ndarray map {{dtype, shape, data}}"));
    let Value::Map(fields) = v else {
        return Err(bad());
    };
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k.as_str() == Some(name))
            .map(|(_, v)| v.clone())
            .ok_or_else(bad)
    };
    let dtype = Dtype::parse(method, &[field("dtype")?], 0)?;
    let (shape, size) = parse_shape(method, &field("shape")?)?;
    let Value::Binary(bytes) = field("data")? else {
        return Err(bad());
    };
    let want = size * dtype.item_size();
    if bytes.len() != want {
        return Err(Error::bad_args(format!(
            "{method}(): data holds {} bytes; shape {} of {} needs {want}",
            bytes.len(),
            show_shape(&shape),
            dtype.name()
        )));
    }
    Ok((shape, Data::decode(dtype, &bytes, target)))
}

impl Array {
    pub fn new(a: &[Value]) -> Result<Self, Error> {
        args::arity("Array", a, 1, 2)?;
        let (shape, size) = parse_shape("Array", &a[0])?;
        let dtype = match args::get(a, 1) {
            Value::Nil => Dtype::F64,
            _ => Dtype::parse("Array", a, 1)?,
        };
        if size.saturating_mul(dtype.item_size()) > MAX_BYTES {
            return Err(Error::value(format!(
                "array is too big: shape {} of {} takes over {MAX_BYTES} bytes",
                show_shape(&shape),
                dtype.name()
            )));
        }
        Ok(Array {
            shape,
            data: Data::zeros(dtype, size),
        })
    }

    pub(crate) fn restore(state: &Value) -> Result<Self, Error> {
        let f = Fields::open("Array", state, &["dtype", "shape", "data"])?;
        let dtype = Dtype::parse("Array", std::slice::from_ref(f.get("dtype")?), 0).map_err(|e| f.wrap(e))?;
        // The snapshot is the wire's ndarray map plus its version: the same parser checks it.
        let (shape, data) = parse_ndarray("Array", state, dtype).map_err(|e| f.wrap(e))?;
        Ok(Array { shape, data })
    }

    /// The fields of the ndarray map, in wire order.
    fn wire_fields(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("dtype", self.data.dtype().name().into()),
            (
                "shape",
                Value::Array(self.shape.iter().map(|&n| Value::from(n)).collect()),
            ),
            ("data", Value::Binary(self.data.encode())),
        ]
    }

    fn to_wire(&self) -> Value {
        Value::Map(self.wire_fields().into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    /// Read an ndarray argument of the same shape, converted to this array's dtype.
    fn same_shape(&self, method: &str, v: &Value) -> Result<Data, Error> {
        let (shape, data) = parse_ndarray(method, v, self.data.dtype())?;
        if shape != self.shape {
            return Err(Error::value(format!(
                "{method}(): shape mismatch: the array has shape {}, the argument {}",
                show_shape(&self.shape),
                show_shape(&shape)
            )));
        }
        Ok(data)
    }

    fn add(&mut self, method: &str, a: &[Value]) -> Result<(), Error> {
        if let Value::Map(_) = a[0] {
            let other = self.same_shape(method, &a[0])?;
            match (&mut self.data, other) {
                (Data::F64(x), Data::F64(y)) => x.iter_mut().zip(y).for_each(|(x, y)| *x += y),
                (Data::F32(x), Data::F32(y)) => x.iter_mut().zip(y).for_each(|(x, y)| *x += y),
                (Data::I64(x), Data::I64(y)) => x.iter_mut().zip(y).for_each(|(x, y)| *x = x.wrapping_add(y)),
                _ => return Err(Error::new(ErrorKind::Internal, "dtype conversion failed")),
            }
            return Ok(());
        }
        let s = Scalar::parse(method, a, 0, "other")?;
        match &mut self.data {
            Data::F64(x) => x.iter_mut().for_each(|x| *x += s.as_f64()),
            Data::F32(x) => x.iter_mut().for_each(|x| *x += s.as_f64() as f32),
            Data::I64(x) => {
                let s = s.as_i64(method)?;
                x.iter_mut().for_each(|x| *x = x.wrapping_add(s));
            }
        }
        Ok(())
    }
}

impl Object for Array {
    fn type_name(&self) -> &'static str {
        "Array"
    }

    fn is_mutating(&self, method: &str) -> bool {
        !matches!(method, "get" | "shape" | "dtype")
    }

    fn size(&self) -> usize {
        self.data.len() * self.data.dtype().item_size()
    }

    fn snapshot(&self) -> Option<Value> {
        Some(snapshot::encode(self.wire_fields()))
    }

    fn apply(&mut self, method: &str, a: &[Value], _ctx: &mut Ctx) -> Result<Step, Error> {
        let v = match method {
            "get" => {
                args::arity(method, a, 0, 0)?;
                self.to_wire()
            }
            "set" => {
                args::arity(method, a, 1, 1)?;
                self.data = self.same_shape(method, &a[0])?;
                Value::Nil
            }
            "add" => {
                args::arity(method, a, 1, 1)?;
                self.add(method, a)?;
                Value::Nil
            }
            "scale" => {
                args::arity(method, a, 1, 1)?;
                let s = Scalar::parse(method, a, 0, "factor")?;
                match &mut self.data {
                    Data::F64(x) => x.iter_mut().for_each(|x| *x *= s.as_f64()),
                    Data::F32(x) => x.iter_mut().for_each(|x| *x = (f64::from(*x) * s.as_f64()) as f32),
                    Data::I64(x) => {
                        let s = s.as_i64(method)?;
                        x.iter_mut().for_each(|x| *x = x.wrapping_mul(s));
                    }
                }
                Value::Nil
            }
            "fill" => {
                args::arity(method, a, 1, 1)?;
                let s = Scalar::parse(method, a, 0, "value")?;
                match &mut self.data {
                    Data::F64(x) => x.fill(s.as_f64()),
                    Data::F32(x) => x.fill(s.as_f64() as f32),
                    Data::I64(x) => x.fill(match s {
                        Scalar::Int(n) => n,
                        Scalar::Float(f) => f as i64,
                    }),
                }
                Value::Nil
            }
            "shape" => {
                args::arity(method, a, 0, 0)?;
                Value::Array(self.shape.iter().map(|&n| Value::from(n)).collect())
            }
            "dtype" => {
                args::arity(method, a, 0, 0)?;
                Value::from(self.data.dtype().name())
            }
            _ => return Err(super::unknown_method("Array", method)),
        };
        Ok(Step::Reply(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::*;

    fn nd(dtype: &str, shape: &[u64], data: Vec<u8>) -> Value {
        Value::Map(vec![
            ("dtype".into(), dtype.into()),
            ("shape".into(), arr(shape.iter().map(|&n| Value::from(n)).collect())),
            ("data".into(), Value::Binary(data)),
        ])
    }

    fn f64s(v: &[f64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn i64s(v: &[i64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn starts_zeroed_with_shape_and_dtype() {
        let mut p = Harness::new();
        p.create_ok("Array", "a", vec![arr(vec![2.into(), 3.into()])]);
        assert_eq!(
            p.ok("Array", "a", "get", vec![]),
            nd("float64", &[2, 3], f64s(&[0.0; 6]))
        );
        assert_eq!(p.ok("Array", "a", "shape", vec![]), arr(vec![2.into(), 3.into()]));
        assert_eq!(p.ok("Array", "a", "dtype", vec![]), Value::from("float64"));
        p.create_ok("Array", "b", vec![4.into(), "int64".into()]);
        assert_eq!(p.ok("Array", "b", "get", vec![]), nd("int64", &[4], i64s(&[0; 4])));
        p.create_ok("Array", "s", vec![arr(vec![])]);
        assert_eq!(p.ok("Array", "s", "get", vec![]), nd("float64", &[], f64s(&[0.0])));
    }

    #[test]
    fn bad_constructors() {
        let mut p = Harness::new();
        let e = p.create_err("Array", "a", vec![(-1).into()]);
        assert_eq!(e.kind, ErrorKind::ValueError);
        let e = p.create_err(
            "Array",
            "a",
            vec![arr(vec![1u64.into(), (1u64 << 31).into(), 2.into()])],
        );
        assert_eq!(e.kind, ErrorKind::ValueError);
        let e = p.create_err("Array", "a", vec![arr(vec![u64::MAX.into(), u64::MAX.into()])]);
        assert_eq!(e.kind, ErrorKind::ValueError);
        // Bytes are bounded too: a tiny create cannot take gigabytes.
        let e = p.create_err("Array", "a", vec![((MAX_BYTES / 8 + 1) as u64).into()]);
        assert!(
            e.kind == ErrorKind::ValueError && e.message.contains("takes over"),
            "{e}"
        );
        p.create_ok("Array", "big", vec![((MAX_BYTES / 4) as u64).into(), "float32".into()]);
        assert_eq!(
            p.create_err("Array", "a", vec![3.into(), "int8".into()]).kind,
            ErrorKind::ValueError
        );
        assert_eq!(
            p.create_err("Array", "a", vec![3.into(), 5.into()]).kind,
            ErrorKind::BadArguments
        );
        assert_eq!(
            p.create_err("Array", "a", vec!["3".into()]).kind,
            ErrorKind::BadArguments
        );
        assert_eq!(
            p.create_err("Array", "a", vec![arr(vec![Value::F64(2.0)])]).kind,
            ErrorKind::BadArguments
        );
        assert_eq!(p.create_err("Array", "a", vec![]).kind, ErrorKind::BadArguments);
    }

    #[test]
    fn set_converts_dtypes() {
        let mut p = Harness::new();
        p.create_ok("Array", "a", vec![3.into(), "int64".into()]);
        p.ok(
            "Array",
            "a",
            "set",
            vec![nd("float64", &[3], f64s(&[1.9, -2.5, f64::NAN]))],
        );
        assert_eq!(p.ok("Array", "a", "get", vec![]), nd("int64", &[3], i64s(&[1, -2, 0])));
        p.create_ok("Array", "f", vec![2.into(), "float32".into()]);
        p.ok("Array", "f", "set", vec![nd("int64", &[2], i64s(&[3, -4]))]);
        assert_eq!(
            p.ok("Array", "f", "get", vec![]),
            nd("float32", &[2], f32s(&[3.0, -4.0]))
        );
        p.ok("Array", "f", "set", vec![nd("float32", &[2], f32s(&[0.5, 1.5]))]);
        assert_eq!(
            p.ok("Array", "f", "get", vec![]),
            nd("float32", &[2], f32s(&[0.5, 1.5]))
        );
    }

    #[test]
    fn shape_and_data_mismatches() {
        let mut p = Harness::new();
        p.create_ok("Array", "a", vec![arr(vec![2.into(), 3.into()])]);
        let e = p.err("Array", "a", "set", vec![nd("float64", &[3, 2], f64s(&[0.0; 6]))]);
        assert_eq!(e.kind, ErrorKind::ValueError);
        assert!(
            e.message.contains("(2, 3)") && e.message.contains("(3, 2)"),
            "{}",
            e.message
        );
        let e = p.err("Array", "a", "add", vec![nd("float64", &[6], f64s(&[0.0; 6]))]);
        assert!(e.message.contains("(6,)"), "{}", e.message);
        let e = p.err("Array", "a", "set", vec![nd("float64", &[2, 3], f64s(&[0.0; 5]))]);
        assert_eq!(e.kind, ErrorKind::BadArguments);
        let e = p.err("Array", "a", "set", vec![nd("float32", &[2, 3], f64s(&[0.0; 6]))]);
        assert_eq!(e.kind, ErrorKind::BadArguments);
        let e = p.err(
            "Array",
            "a",
            "set",
            vec![Value::Map(vec![("dtype".into(), "float64".into())])],
        );
        assert_eq!(e.kind, ErrorKind::BadArguments);
        assert_eq!(p.err("Array", "a", "set", vec![5.into()]).kind, ErrorKind::BadArguments);
        let e = p.err("Array", "a", "set", vec![nd("float64", &[1 << 40], vec![])]);
        assert_eq!(e.kind, ErrorKind::ValueError);
        assert_eq!(
            p.ok("Array", "a", "get", vec![]),
            nd("float64", &[2, 3], f64s(&[0.0; 6]))
        );
    }

    #[test]
    fn add_scale_fill() {
        let mut p = Harness::new();
        p.create_ok("Array", "a", vec![2.into()]);
        p.ok("Array", "a", "add", vec![nd("float64", &[2], f64s(&[1.5, 2.0]))]);
        p.ok("Array", "a", "add", vec![nd("int64", &[2], i64s(&[1, 1]))]);
        p.ok("Array", "a", "add", vec![1.into()]);
        p.ok("Array", "a", "scale", vec![Value::F64(2.0)]);
        // (0 + [1.5, 2] + [1, 1] + 1) * 2
        assert_eq!(
            p.ok("Array", "a", "get", vec![]),
            nd("float64", &[2], f64s(&[7.0, 8.0]))
        );
        p.ok("Array", "a", "fill", vec![Value::F64(0.25)]);
        assert_eq!(
            p.ok("Array", "a", "get", vec![]),
            nd("float64", &[2], f64s(&[0.25, 0.25]))
        );
        assert_eq!(
            p.err("Array", "a", "scale", vec!["x".into()]).kind,
            ErrorKind::BadArguments
        );
    }

    #[test]
    fn int64_wraps_and_wants_integers() {
        let mut p = Harness::new();
        p.create_ok("Array", "i", vec![2.into(), "int64".into()]);
        p.ok("Array", "i", "fill", vec![i64::MAX.into()]);
        p.ok("Array", "i", "add", vec![1.into()]);
        assert_eq!(
            p.ok("Array", "i", "get", vec![]),
            nd("int64", &[2], i64s(&[i64::MIN; 2]))
        );
        p.ok("Array", "i", "fill", vec![3.into()]);
        p.ok("Array", "i", "scale", vec![(-2).into()]);
        assert_eq!(p.ok("Array", "i", "get", vec![]), nd("int64", &[2], i64s(&[-6; 2])));
        assert_eq!(
            p.err("Array", "i", "scale", vec![Value::F64(1.5)]).kind,
            ErrorKind::BadArguments
        );
        assert_eq!(
            p.err("Array", "i", "add", vec![Value::F64(1.5)]).kind,
            ErrorKind::BadArguments
        );
        p.ok("Array", "i", "fill", vec![Value::F64(2.9)]);
        assert_eq!(p.ok("Array", "i", "get", vec![]), nd("int64", &[2], i64s(&[2; 2])));
        let o = Array::new(&[1.into()]).unwrap();
        assert!(!o.is_mutating("get") && o.is_mutating("add"));
    }
}
