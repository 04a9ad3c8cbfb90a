//! The fused channel RMS norm + SiLU gives the bytes of the two ops one after the other,
//! and the RMS norm the same bytes on every CPU path this machine runs. Its own test
//! binary: it switches the process-wide CPU path.

mod common;

use common::{cpu, rand, Rng};
use headroom_tensor::kernels::cpu::{set_path, CpuPath};
use headroom_tensor::Tensor;

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_f32_vec()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

#[test]
fn fused_rms_norm_silu_gives_the_bytes_of_the_two_ops_on_every_path() {
    let device = cpu();
    let mut rng = Rng::new(3);
    // Odd sizes: 7 channels, 3 × 5 × 13 positions (rows not a multiple of any vector).
    let (x, _) = rand(&mut rng, &[2, 7, 3, 5, 13], 4.0, &device);
    let (gamma, _) = rand(&mut rng, &[7, 1, 1, 1], 1.5, &device);
    let mut reference: Option<(Vec<u32>, Vec<u32>)> = None;
    let mut ran = Vec::new();
    for path in CpuPath::ALL.into_iter().filter(|p| p.supported()) {
        set_path(Some(path)).unwrap();
        let norm = x.rms_norm_channels(&gamma).unwrap();
        let two = norm.silu().unwrap();
        let fused = x.rms_norm_channels_silu(&gamma).unwrap();
        assert!(bits(&fused) == bits(&two), "{path}: fused differs");
        let got = (bits(&norm), bits(&fused));
        match &reference {
            None => reference = Some(got),
            Some(r) => assert!(*r == got, "{path}: differs from the scalar path"),
        }
        ran.push(path.name());
    }
    set_path(None).unwrap();
    println!("paths checked: {ran:?}");
}
