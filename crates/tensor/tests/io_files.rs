//! safetensors and .npy round trips.

mod common;

use common::cpu;
use headroom_tensor::io::npy::{parse_npy, read_npy, write_npy};
use headroom_tensor::io::safetensors::{save_safetensors, SafetensorsFile};
use headroom_tensor::{DType, Tensor};

#[test]
fn safetensors_round_trip_and_convert_on_load() {
    let dev = cpu();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    let a = Tensor::from_slice(&[1.5f32, -2.0, 3.25, 0.0, 7.0, 8.0], &[2, 3], &dev).unwrap();
    let b = a.to_dtype(DType::BF16).unwrap();
    let c = Tensor::from_slice(&[5i64, -6], &[2], &dev).unwrap();
    let at = a.transpose(0, 1).unwrap();
    save_safetensors(
        &path,
        &[("a", &a), ("b.weight", &b), ("c", &c), ("at", &at)],
    )
    .unwrap();
    let file = SafetensorsFile::open(&path).unwrap();
    assert_eq!(file.names().unwrap(), ["a", "at", "b.weight", "c"]);
    assert_eq!(file.info("b.weight").unwrap(), (vec![2, 3], DType::BF16));
    let b32 = file.load("b.weight", &dev, Some(DType::F32)).unwrap();
    assert_eq!(b32.to_vec::<f32>().unwrap(), a.to_vec::<f32>().unwrap());
    let at2 = file.load("at", &dev, None).unwrap();
    assert_eq!(at2.shape(), [3, 2]);
    assert_eq!(
        at2.to_vec::<f32>().unwrap(),
        [1.5, 0.0, -2.0, 7.0, 3.25, 8.0]
    );
    assert_eq!(
        file.load("c", &dev, None).unwrap().to_vec::<i64>().unwrap(),
        [5, -6]
    );
    let err = file.load("missing", &dev, None).unwrap_err().to_string();
    assert!(err.contains("no tensor named \"missing\""), "{err}");
    let err = SafetensorsFile::open(dir.path().join("nope"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("nope"), "{err}");
}

#[test]
fn loaded_tensors_live_in_allocator_blocks() {
    let dev = cpu();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    let a = Tensor::zeros(&[256, 256], DType::F32, &dev).unwrap();
    save_safetensors(&path, &[("a", &a)]).unwrap();
    let before = dev.platform().memory_stats().allocated_bytes.all().current;
    let loaded = SafetensorsFile::open(&path)
        .unwrap()
        .load("a", &dev, Some(DType::BF16))
        .unwrap();
    let after = dev.platform().memory_stats().allocated_bytes.all().current;
    assert_eq!(loaded.dtype(), DType::BF16);
    assert!(after - before >= 256 * 256 * 2);
}

#[test]
fn npy_round_trips_every_numpy_dtype() {
    let dev = cpu();
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &dev).unwrap(),
        Tensor::from_slice(&[1u8, 2, 255], &[3], &dev).unwrap(),
        Tensor::from_slice(&[-1i64, 1 << 40], &[2, 1], &dev).unwrap(),
        Tensor::from_f32(&[0.5, -0.25], &[2], DType::F16, &dev).unwrap(),
    ];
    for (i, t) in cases.iter().enumerate() {
        let path = dir.path().join(format!("{i}.npy"));
        write_npy(&path, t).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let header_end = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        assert_eq!(header_end % 64, 0, "data is 64-byte aligned");
        let back = read_npy(&path, &dev).unwrap();
        assert_eq!(back.shape(), t.shape());
        assert_eq!(back.dtype(), t.dtype());
        assert_eq!(back.to_f32_vec().unwrap(), t.to_f32_vec().unwrap());
    }
}

/// A `.npy` file of `descr` and the shape text `shape`, followed by `data`.
fn npy_bytes(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    let header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

#[test]
fn npy_shapes_past_addressable_memory_are_refused_not_a_panic() {
    // Found by fuzz/fuzz_targets/npy.rs: the element count of an untrusted shape
    // overflowed while it was multiplied out.
    let dev = cpu();
    for shape in [
        "(4294967296, 4294967296)",
        "(2, 3, 3000000000000000000)",
        "(0, 4294967296, 4294967296)",
        "(4294967296, 4294967296, 0)",
    ] {
        let err = parse_npy(&npy_bytes("<f4", shape, &[]), &dev)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("larger than memory can address"),
            "{shape}: {err}"
        );
    }
}

#[test]
fn npy_arrays_with_a_zero_length_axis_load_empty() {
    // Found through fuzz/fuzz_targets/camera.rs: widening such a tensor to f32 asserted.
    let dev = cpu();
    let t = parse_npy(&npy_bytes("<f2", "(2, 0, 3)", &[]), &dev).unwrap();
    assert_eq!(t.shape(), [2, 0, 3]);
    assert!(t.to_f32_vec().unwrap().is_empty());
}

#[test]
fn npy_reads_f64_as_f32_and_rejects_what_it_cannot_read() {
    let dev = cpu();
    let header = "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }";
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&1.5f64.to_le_bytes());
    bytes.extend_from_slice(&(-2.0f64).to_le_bytes());
    let t = parse_npy(&bytes, &dev).unwrap();
    assert_eq!(
        (t.dtype(), t.to_vec::<f32>().unwrap()),
        (DType::F32, vec![1.5, -2.0])
    );
    let fortran = header.replace("False", "True ");
    let mut f = b"\x93NUMPY\x01\x00".to_vec();
    f.extend_from_slice(&(fortran.len() as u16).to_le_bytes());
    f.extend_from_slice(fortran.as_bytes());
    f.extend_from_slice(&bytes[10 + header.len()..]);
    assert!(parse_npy(&f, &dev)
        .unwrap_err()
        .to_string()
        .contains("Fortran"));
    let err = parse_npy(b"not numpy", &dev).unwrap_err().to_string();
    assert!(err.contains("magic"), "{err}");
    let mut truncated = bytes.clone();
    truncated.truncate(bytes.len() - 4);
    assert!(parse_npy(&truncated, &dev)
        .unwrap_err()
        .to_string()
        .contains("shorter"));
}
