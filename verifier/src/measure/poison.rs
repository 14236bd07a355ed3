//! The output poison: pseudo-random bytes drawn from a fresh key before every launch of the
//! candidate (verification, batch compositions and timed launches alike), so a kernel can tell
//! neither a poisoned buffer by its pattern nor a timed launch by its output's old contents.
//! An element is "never written" when it holds launch 1's poison after launch 1 and the inverted
//! poison after launch 2: no value equals both.

use rand::Rng;
use rayon::prelude::*;

/// One launch's poison (the GPU fills with `kz_fill_pattern`; the host recomputes any byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Poison {
    pub key: u64,
    pub invert: bool,
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Poison {
    /// A fresh poison (a key from the OS's randomness, never derived from the run seed: a
    /// replayed run must not let a kernel learn it).
    pub fn fresh() -> Poison {
        Poison {
            key: rand::thread_rng().gen(),
            invert: false,
        }
    }

    /// The same pattern with every bit inverted.
    pub fn inverted(self) -> Poison {
        Poison {
            invert: !self.invert,
            ..self
        }
    }

    /// The 8 poison bytes starting at byte offset `8 * word`.
    pub fn word(&self, word: u64) -> [u8; 8] {
        let z = mix(self
            .key
            .wrapping_add(word.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        (if self.invert { !z } else { z }).to_le_bytes()
    }

    /// The poison byte at byte offset `i`.
    pub fn byte(&self, i: usize) -> u8 {
        self.word(i as u64 / 8)[i % 8]
    }

    /// Whether `bytes[range]` (a byte range of the payload) holds this poison in every byte.
    pub fn holds(&self, bytes: &[u8], range: std::ops::Range<usize>) -> bool {
        let mut word = (u64::MAX, [0u8; 8]);
        range.clone().all(|i| {
            let w = i as u64 / 8;
            if word.0 != w {
                word = (w, self.word(w));
            }
            bytes[i] == word.1[i % 8]
        })
    }

    /// The whole pattern for `n` bytes (host side, for tests and small buffers).
    pub fn bytes(&self, n: usize) -> Vec<u8> {
        (0..n).map(|i| self.byte(i)).collect()
    }
}

/// Elements (of `elem_bytes` each) that launch 1 left at poison `p` and launch 2 left at
/// `p.inverted()`: never written. Returns the count and the first such element.
pub fn never_written(
    first: &[u8],
    second: &[u8],
    p: Poison,
    elem_bytes: usize,
) -> (u64, Option<usize>) {
    let q = p.inverted();
    let n = first.len() / elem_bytes;
    let unwritten = |e: usize| {
        let r = e * elem_bytes..(e + 1) * elem_bytes;
        p.holds(first, r.clone()) && q.holds(second, r)
    };
    let count = (0..n).into_par_iter().filter(|&e| unwritten(e)).count() as u64;
    let first_at = if count > 0 {
        (0..n).into_par_iter().find_first(|&e| unwritten(e))
    } else {
        None
    };
    (count, first_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_per_key_and_invert_exactly() {
        let a = Poison {
            key: 1,
            invert: false,
        };
        let b = Poison {
            key: 2,
            invert: false,
        };
        assert_ne!(a.bytes(64), b.bytes(64));
        let (pa, pi) = (a.bytes(1001), a.inverted().bytes(1001));
        assert!(pa.iter().zip(&pi).all(|(x, y)| *x == !*y));
        assert_eq!(a.inverted().inverted(), a);
        // Not a repeated byte or word: a kernel cannot recognise it as a memset.
        assert!(pa.windows(2).any(|w| w[0] != w[1]));
        assert_ne!(pa[0..8], pa[8..16]);
    }

    #[test]
    fn an_element_is_unwritten_only_if_it_kept_both_poisons() {
        let p = Poison::fresh();
        let es = 2;
        let mut first = p.bytes(20);
        let mut second = p.inverted().bytes(20);
        // Elements 0..10 all unwritten.
        assert_eq!(never_written(&first, &second, p, es), (10, Some(0)));
        // Write element 0 in both launches, element 3 only in the second.
        for buf in [&mut first, &mut second] {
            buf[0] = 0x12;
            buf[1] = 0x34;
        }
        second[6] ^= 1;
        assert_eq!(never_written(&first, &second, p, es), (8, Some(1)));
        // A correct value that happens to equal one poison is still counted as written.
        let mut second2 = second.clone();
        second2[2..4].copy_from_slice(&first[2..4]);
        assert_eq!(never_written(&first, &second2, p, es), (7, Some(2)));
    }
}
