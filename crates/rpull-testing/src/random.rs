//! Deterministic incompressible test data.

/// `len` pseudo-random bytes from a xorshift64* generator seeded with `seed`: incompressible
/// (a gzip layer of it is as large as its tar) and the same for the same seed.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}
