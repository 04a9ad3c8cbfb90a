//! A `.safetensors` file's bytes through `headroom_tensor::io::safetensors::SafetensorsFile`:
//! open (header check), names, info and load of every tensor onto the CPU. The file
//! API maps a path, so each input is written to one scratch file per process first.
#![no_main]

use headroom_tensor::io::safetensors::SafetensorsFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!(
        "headroom-fuzz-safetensors-{}.safetensors",
        std::process::id()
    ));
    std::fs::write(&path, data).expect("writing the scratch file");
    if let Ok(file) = SafetensorsFile::open(&path) {
        for name in file.names().unwrap_or_default() {
            let _ = file.info(&name);
            let _ = file.load(&name, headroom_fuzz::cpu(), None);
        }
    }
});
