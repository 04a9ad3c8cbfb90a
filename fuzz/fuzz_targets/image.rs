//! `headroom_media::decode_image` (PNG/JPEG) with the server's 8192-pixel side limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
// The 256 MiB heap bound (src/lib.rs) holds only where the library is linked.
use headroom_fuzz as _;

fuzz_target!(|data: &[u8]| {
    let _ = headroom_media::decode_image(data, 8192);
});
