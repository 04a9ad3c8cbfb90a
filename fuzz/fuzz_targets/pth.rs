//! A `.pth` checkpoint's bytes: the zip index
//! (`headroom_tensor::io::pth::zip::stored_entries`) and the checked tensor index
//! (`headroom_tensor::io::pth::index::read_pth`, which runs the restricted pickle).
#![no_main]

use headroom_tensor::io::pth::{index::read_pth, zip::stored_entries};
use libfuzzer_sys::fuzz_target;
// The 256 MiB heap bound (src/lib.rs) holds only where the library is linked.
use headroom_fuzz as _;

fuzz_target!(|data: &[u8]| {
    let _ = stored_entries(data);
    let _ = read_pth(data);
});
