//! A walk over a GGUF header that checks every length it claims against the bytes the file
//! holds, before candle's reader trusts them. candle's `Content::read` allocates what a
//! length says (a string of 2^60 bytes, a tensor of 2^32 dimensions) and divides by the
//! file's `general.alignment` unchecked, so a crafted file aborted the process or panicked
//! (found by the `gguf_metadata` fuzz target). This reads nothing into memory but the
//! alignment key's name and value: it owns no model knowledge (that is `gguf.rs`), only the format's framing.

use std::io::{Read, Seek, SeekFrom};

/// GGML's most dimensions for one tensor (`GGML_MAX_DIMS`).
const MAX_DIMENSIONS: u32 = 4;
/// Arrays of arrays nest this deep at most (the format allows it; no model nests at all).
const MAX_ARRAY_DEPTH: u32 = 4;

const MAGIC: [u8; 4] = *b"GGUF";
const ALIGNMENT_KEY: &[u8; 17] = b"general.alignment";
/// Keys up to this long are read and compared with [`ALIGNMENT_KEY`]; longer ones skipped.
const MAX_KEY_COMPARED: u64 = 4096;
const TYPE_STRING: u32 = 8;
const TYPE_ARRAY: u32 = 9;

/// Checks the header framing of the GGUF file `reader` holds and leaves it at its start.
/// `Err` says what is wrong in words for [`super::ModelError::NotGguf`].
pub(crate) fn check_framing<R: Read + Seek>(reader: &mut R) -> Result<(), String> {
    let len = reader.seek(SeekFrom::End(0)).map_err(|e| e.to_string())?;
    reader.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    let mut walk = Walk { reader, len, at: 0 };
    walk.check()?;
    reader_rewind(walk.reader)
}

fn reader_rewind<R: Seek>(reader: &mut R) -> Result<(), String> {
    reader
        .seek(SeekFrom::Start(0))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

struct Walk<'r, R> {
    reader: &'r mut R,
    len: u64,
    at: u64,
}

impl<R: Read + Seek> Walk<'_, R> {
    fn check(&mut self) -> Result<(), String> {
        let mut magic = [0; 4];
        self.read(&mut magic)?;
        if magic != MAGIC {
            return Err("no GGUF magic at the start".into());
        }
        let version = self.u32()?;
        if !(2..=3).contains(&version) {
            return Err(format!(
                "GGUF version {version} (versions 2 and 3 are read)"
            ));
        }
        let tensors = self.u64()?;
        let entries = self.u64()?;
        for _ in 0..entries {
            let key = self.string_len()?;
            // candle trims NULs off both ends of a key, so "general.alignment\0" is it too.
            let alignment = if key <= MAX_KEY_COMPARED {
                let mut name = vec![0; key as usize];
                self.read(&mut name)?;
                let start = name.iter().position(|&b| b != 0).unwrap_or(name.len());
                let end = name.iter().rposition(|&b| b != 0).map_or(start, |i| i + 1);
                name[start..end] == *ALIGNMENT_KEY
            } else {
                self.skip(key)?;
                false
            };
            let value_type = self.u32()?;
            if alignment && matches!(value_type, 0..=5) {
                // candle divides by the integer types up to 32 bits (and falls back to 32
                // for the others, u64 among them): a 0 there was a division by zero.
                let mut value = [0; 4];
                let size = fixed_size(value_type).unwrap_or(4) as usize;
                self.read(&mut value[..size])?;
                if u32::from_le_bytes(value) == 0 {
                    return Err("general.alignment is 0".into());
                }
            } else {
                self.value(value_type, 0)?;
            }
        }
        for _ in 0..tensors {
            let name = self.string_len()?;
            self.skip(name)?;
            let dimensions = self.u32()?;
            if dimensions == 0 || dimensions > MAX_DIMENSIONS {
                return Err(format!(
                    "a tensor with {dimensions} dimensions (1 to {MAX_DIMENSIONS})"
                ));
            }
            // Each dimension (u64), then the type (u32) and the data offset (u64).
            self.skip(u64::from(dimensions) * 8 + 4 + 8)?;
        }
        Ok(())
    }

    /// Skips one metadata value of `value_type` (`depth`: the arrays it is inside).
    fn value(&mut self, value_type: u32, depth: u32) -> Result<(), String> {
        match value_type {
            TYPE_STRING => {
                let len = self.string_len()?;
                self.skip(len)
            }
            TYPE_ARRAY => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!("arrays nested more than {MAX_ARRAY_DEPTH} deep"));
                }
                let element_type = self.u32()?;
                let count = self.u64()?;
                match fixed_size(element_type) {
                    Some(size) => self.skip(count.checked_mul(size).ok_or("an array too long")?),
                    None => {
                        // Strings and arrays: each takes at least its 8-byte length.
                        if count > (self.len - self.at) / 8 {
                            return Err(format!("an array of {count} values in a shorter file"));
                        }
                        for _ in 0..count {
                            self.value(element_type, depth + 1)?;
                        }
                        Ok(())
                    }
                }
            }
            other => match fixed_size(other) {
                Some(size) => self.skip(size),
                None => Err(format!("metadata value type {other} is unknown")),
            },
        }
    }

    fn string_len(&mut self) -> Result<u64, String> {
        let len = self.u64()?;
        if len > self.len - self.at {
            return Err(format!(
                "a string of {len} bytes at byte {}, in a file of {}",
                self.at, self.len
            ));
        }
        Ok(len)
    }

    fn skip(&mut self, bytes: u64) -> Result<(), String> {
        if bytes > self.len - self.at {
            return Err(format!(
                "truncated header: {bytes} bytes claimed at byte {}",
                self.at
            ));
        }
        self.at += bytes;
        self.reader
            .seek(SeekFrom::Start(self.at))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn read(&mut self, into: &mut [u8]) -> Result<(), String> {
        if into.len() as u64 > self.len - self.at {
            return Err(format!("truncated header at byte {}", self.at));
        }
        self.reader.read_exact(into).map_err(|e| e.to_string())?;
        self.at += into.len() as u64;
        Ok(())
    }

    fn u32(&mut self) -> Result<u32, String> {
        let mut bytes = [0; 4];
        self.read(&mut bytes)?;
        Ok(u32::from_le_bytes(bytes))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let mut bytes = [0; 8];
        self.read(&mut bytes)?;
        Ok(u64::from_le_bytes(bytes))
    }
}

/// Bytes of one value of a fixed-size metadata type; `None` for strings, arrays and unknown
/// types.
fn fixed_size(value_type: u32) -> Option<u64> {
    match value_type {
        0 | 1 | 7 => Some(1), // u8, i8, bool
        2 | 3 => Some(2),     // u16, i16
        4..=6 => Some(4),     // u32, i32, f32
        10..=12 => Some(8),   // u64, i64, f64
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn header(entries: &[Vec<u8>], tensors: &[Vec<u8>]) -> Vec<u8> {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(3u32.to_le_bytes());
        bytes.extend((tensors.len() as u64).to_le_bytes());
        bytes.extend((entries.len() as u64).to_le_bytes());
        entries.iter().for_each(|e| bytes.extend(e));
        tensors.iter().for_each(|t| bytes.extend(t));
        bytes
    }

    fn string(text: &str) -> Vec<u8> {
        let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
        bytes.extend(text.as_bytes());
        bytes
    }

    fn entry(key: &str, value_type: u32, value: &[u8]) -> Vec<u8> {
        let mut bytes = string(key);
        bytes.extend(value_type.to_le_bytes());
        bytes.extend(value);
        bytes
    }

    fn tensor(name: &str, dims: &[u64]) -> Vec<u8> {
        let mut bytes = string(name);
        bytes.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| bytes.extend(d.to_le_bytes()));
        bytes.extend(0u32.to_le_bytes());
        bytes.extend(0u64.to_le_bytes());
        bytes
    }

    fn check(bytes: Vec<u8>) -> Result<(), String> {
        check_framing(&mut Cursor::new(bytes))
    }

    #[test]
    fn a_well_framed_header_passes_and_is_rewound() {
        let mut names = TYPE_STRING.to_le_bytes().to_vec(); // an array of two strings
        names.extend(2u64.to_le_bytes());
        names.extend(string("a"));
        names.extend(string("bc"));
        let bytes = header(
            &[
                entry("general.architecture", TYPE_STRING, &string("llama")),
                entry("general.alignment", 4, &32u32.to_le_bytes()),
                entry("tokenizer.ggml.tokens", TYPE_ARRAY, &names),
            ],
            &[tensor("token_embd.weight", &[256, 8])],
        );
        let mut cursor = Cursor::new(bytes);
        check_framing(&mut cursor).unwrap();
        assert_eq!(cursor.position(), 0);
    }

    #[test]
    fn lengths_past_the_file_are_refused_before_anything_is_allocated() {
        let mut huge = (1u64 << 60).to_le_bytes().to_vec();
        huge.extend(b"x");
        let err = check(header(&[entry("k", TYPE_STRING, &huge)], &[])).unwrap_err();
        assert!(
            err.contains("a string of 1152921504606846976 bytes"),
            "{err}"
        );
        let mut array = TYPE_STRING.to_le_bytes().to_vec();
        array.extend(u64::MAX.to_le_bytes());
        let err = check(header(&[entry("k", TYPE_ARRAY, &array)], &[])).unwrap_err();
        assert!(err.contains("an array of"), "{err}");
        let err = check(header(&[], &[tensor("t", &[1; 5])])).unwrap_err();
        assert!(err.contains("5 dimensions"), "{err}");
        let err = check(header(&[entry("k", 99, &[])], &[])).unwrap_err();
        assert!(err.contains("type 99 is unknown"), "{err}");
        let mut truncated = header(&[], &[tensor("t", &[4, 4])]);
        truncated.truncate(truncated.len() - 3);
        assert!(check(truncated).unwrap_err().contains("truncated"));
        let mut old = header(&[], &[]);
        old[4] = 1;
        assert!(check(old).unwrap_err().contains("GGUF version 1"));
    }

    #[test]
    fn a_zero_alignment_is_refused() {
        let bytes = header(&[entry("general.alignment", 4, &0u32.to_le_bytes())], &[]);
        assert_eq!(check(bytes).unwrap_err(), "general.alignment is 0");
        let bytes = header(&[entry("general.alignment", 0, &[0])], &[]);
        assert_eq!(check(bytes).unwrap_err(), "general.alignment is 0");
        // The fuzz target's find: candle trims NULs from keys.
        let bytes = header(&[entry("\0general.alignment\0\0", 2, &[0, 0])], &[]);
        assert_eq!(check(bytes).unwrap_err(), "general.alignment is 0");
    }

    #[test]
    fn nesting_is_bounded() {
        let mut value = 4u32.to_le_bytes().to_vec(); // the innermost: no u32s
        value.extend(0u64.to_le_bytes());
        for _ in 0..6 {
            let mut outer = TYPE_ARRAY.to_le_bytes().to_vec();
            outer.extend(1u64.to_le_bytes());
            outer.extend(value);
            value = outer;
        }
        let err = check(header(&[entry("k", TYPE_ARRAY, &value)], &[])).unwrap_err();
        assert!(err.contains("nested more than 4 deep"), "{err}");
    }
}
