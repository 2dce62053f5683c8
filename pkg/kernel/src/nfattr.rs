//! Reading the attributes of nfnetlink messages that weft decodes by hand (NFLOG,
//! NFQUEUE), so each subsystem's module only names its attributes (they are written
//! with [`crate::nftset::attr`]).

/// The attributes of `body` after its 4-byte nfgenmsg header: each type (without the
/// nested and byte-order flags) with its data. Stops at the first that does not fit.
pub(crate) fn attrs(body: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut off = 4;
    std::iter::from_fn(move || {
        if off + 4 > body.len() {
            return None;
        }
        let len = u16::from_ne_bytes([body[off], body[off + 1]]) as usize;
        let ty = u16::from_ne_bytes([body[off + 2], body[off + 3]]) & 0x3fff;
        if len < 4 || off + len > body.len() {
            return None;
        }
        let data = &body[off + 4..off + len];
        off += len.next_multiple_of(4);
        Some((ty, data))
    })
}

/// The first four bytes of `data` as a big-endian number.
pub(crate) fn be32(data: &[u8]) -> Option<u32> {
    data.get(..4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}
