//! Writes the JSON document on stdin as YAML with bitpool's go-yaml-compatible writer, to compare
//! with what `sigs.k8s.io/yaml` writes for the same input (see `hack/goyaml-diff.sh`).

use std::io::Read;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let json: serde_json::Value = serde_json::from_str(&input)?;
    print!("{}", bitpool::render::goyaml::to_string(&(&json).into()));
    Ok(())
}
