//! A msgpack reader for the payloads vLLM's KV event publisher sends (msgspec's encoding: arrays,
//! maps with string keys, integers, floats, strings, bytes, nil, booleans). Hand-written: about 100
//! lines against the `rmp`/`rmpv` crates, for the one shape the router reads.

#[derive(Debug, Clone, PartialEq)]
pub enum Mp {
    Nil,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Bin(Vec<u8>),
    Array(Vec<Mp>),
    Map(Vec<(Mp, Mp)>),
}

impl Mp {
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Mp::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Mp::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Mp]> {
        match self {
            Mp::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A map's value for a string key.
    pub fn get(&self, key: &str) -> Option<&Mp> {
        match self {
            Mp::Map(m) => m.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v),
            _ => None,
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
    depth: usize,
    /// Values decoded so far: a payload may not make more than MAX_VALUES (each costs ~40 bytes
    /// decoded against 1 byte encoded).
    values: usize,
}

const MAX_VALUES: usize = 4 << 20;

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.buf.len()).ok_or("msgpack: truncated")?;
        let out = self.buf.get(self.at..end).ok_or("msgpack: truncated")?;
        self.at = end;
        Ok(out)
    }

    fn uint(&mut self, n: usize) -> Result<u64, String> {
        Ok(self.take(n)?.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    fn len(&mut self, n: usize) -> Result<usize, String> {
        let len = usize::try_from(self.uint(n)?).map_err(|e| e.to_string())?;
        if len > self.buf.len() - self.at {
            return Err("msgpack: a length past the end".into());
        }
        Ok(len)
    }

    fn many(&mut self, n: usize) -> Result<Vec<Mp>, String> {
        (0..n).map(|_| self.value()).collect()
    }

    fn pairs(&mut self, n: usize) -> Result<Vec<(Mp, Mp)>, String> {
        (0..n).map(|_| Ok((self.value()?, self.value()?))).collect()
    }

    fn text(&mut self, n: usize) -> Result<Mp, String> {
        Ok(Mp::Str(String::from_utf8(self.take(n)?.to_vec()).map_err(|e| e.to_string())?))
    }

    fn value(&mut self) -> Result<Mp, String> {
        self.depth += 1;
        self.values += 1;
        if self.values > MAX_VALUES {
            return Err("msgpack: too many values".into());
        }
        if self.depth > 64 {
            return Err("msgpack: nested too deep".into());
        }
        let b = *self.take(1)?.first().ok_or("msgpack: truncated")?;
        let v = match b {
            0x00..=0x7f => Mp::Int(i128::from(b)),
            0x80..=0x8f => Mp::Map(self.pairs(usize::from(b & 0x0f))?),
            0x90..=0x9f => Mp::Array(self.many(usize::from(b & 0x0f))?),
            0xa0..=0xbf => self.text(usize::from(b & 0x1f))?,
            0xc0 => Mp::Nil,
            0xc2 => Mp::Bool(false),
            0xc3 => Mp::Bool(true),
            0xc4..=0xc6 => {
                let n = self.len(1 << (b - 0xc4))?;
                Mp::Bin(self.take(n)?.to_vec())
            }
            0xca => Mp::Float(f64::from(f32::from_bits(self.uint(4)? as u32))),
            0xcb => Mp::Float(f64::from_bits(self.uint(8)?)),
            0xcc..=0xcf => Mp::Int(i128::from(self.uint(1 << (b - 0xcc))?)),
            0xd0..=0xd3 => {
                let n = 1usize << (b - 0xd0);
                let raw = self.uint(n)?;
                let shift = 64 - 8 * n as u32;
                Mp::Int(i128::from(((raw << shift) as i64) >> shift))
            }
            0xd9..=0xdb => {
                let n = self.len(1 << (b - 0xd9))?;
                self.text(n)?
            }
            0xdc | 0xdd => {
                let n = self.len(if b == 0xdc { 2 } else { 4 })?;
                Mp::Array(self.many(n)?)
            }
            0xde | 0xdf => {
                let n = self.len(if b == 0xde { 2 } else { 4 })?;
                Mp::Map(self.pairs(n)?)
            }
            0xe0..=0xff => Mp::Int(i128::from(b as i8)),
            other => return Err(format!("msgpack: type 0x{other:02x} is not read here")),
        };
        self.depth -= 1;
        Ok(v)
    }
}

pub fn decode(buf: &[u8]) -> Result<Mp, String> {
    let mut r = Reader { buf, at: 0, depth: 0, values: 0 };
    let v = r.value()?;
    if r.at != buf.len() {
        return Err("msgpack: bytes after the value".into());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_msgspec_writes() {
        // [1.5, [{"type": "X", "h": [2**64-1, -3]}], nil]
        let mut b = vec![0x93, 0xcb];
        b.extend_from_slice(&1.5f64.to_bits().to_be_bytes());
        b.extend_from_slice(&[0x91, 0x82, 0xa4, b't', b'y', b'p', b'e', 0xa1, b'X', 0xa1, b'h', 0x92, 0xcf]);
        b.extend_from_slice(&u64::MAX.to_be_bytes());
        b.extend_from_slice(&[0xfd, 0xc0]);
        let v = decode(&b).unwrap_or(Mp::Nil);
        let items = v.as_array().unwrap_or_default();
        assert_eq!(items.first(), Some(&Mp::Float(1.5)));
        let event = items.get(1).and_then(Mp::as_array).and_then(|e| e.first()).cloned().unwrap_or(Mp::Nil);
        assert_eq!(event.get("type").and_then(Mp::as_str), Some("X"));
        assert_eq!(event.get("h"), Some(&Mp::Array(vec![Mp::Int(i128::from(u64::MAX)), Mp::Int(-3)])));
        assert_eq!(items.get(2), Some(&Mp::Nil));
        assert!(decode(&[0x92, 0x01]).is_err(), "truncated");
        assert!(decode(&[0xdc, 0xff, 0xff]).is_err(), "a length past the end");
        assert!(decode(&[0x01, 0x02]).is_err(), "trailing bytes");
    }
}
