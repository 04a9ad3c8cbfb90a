//! `headroom_server::decode_image_url`: a `data:` URL decoded and cover-cropped to a
//! session size. The first two bytes pick width and height as `16 + 4·b`, capped at
//! 1024; the rest is the URL. (`session.start` accepts sides up to 3840, but a 3840²
//! frame alone is ~180 MB of f32 by design; below 1024 a frame is ~12 MB, so anything
//! near the 256 MiB bound is the decoder's or the crop's doing.)
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [w, h, url @ ..] = data else {
        return;
    };
    let side = |b: u8| (16 + 4 * usize::from(b)).min(1024);
    if let Ok(url) = std::str::from_utf8(url) {
        let _ = headroom_server::decode_image_url(url, side(*w), side(*h), headroom_fuzz::cpu());
    }
});
