//! `headroom_mem::pickle::{from_pickle, from_pickle_restricted}` on arbitrary bytes
//! (restricted with the allow-list `.pth` checkpoints use).
#![no_main]

use headroom_mem::pickle::{from_pickle, from_pickle_restricted};
use headroom_tensor::io::pth::index::allowed_globals;
use libfuzzer_sys::fuzz_target;
// The 256 MiB heap bound (src/lib.rs) holds only where the library is linked.
use headroom_fuzz as _;

fuzz_target!(|data: &[u8]| {
    let _ = from_pickle(data);
    let _ = from_pickle_restricted(data, &allowed_globals());
});
