//! Shared set-up for the integration tests, one file per concern: the cluster and a namespace
//! per test (`env`), CRDs (`crds`), `bitpool run` processes (`process`), waiting (`wait`),
//! builders of pools and claims (`build`), assertions (`check`), objects of any kind as JSON
//! (`dynamic`); and the rarer parts: a control
//! plane of a test's own (`plane`), a relay that cuts the API server off (`cut`), one that holds
//! back the lists of one resource (`hold`), webhooks served
//! to the control plane (`webhook`), and the probe and metrics endpoints (`ops`).
#![allow(dead_code, unused_imports)] // each test binary uses a different part of this module

pub mod build;
pub mod check;
pub mod clusterctl;
pub mod crds;
pub mod cut;
pub mod dynamic;
pub mod env;
pub mod hold;
pub mod ops;
pub mod plane;
pub mod process;
pub mod stack;
pub mod wait;
pub mod webhook;

pub use crds::{install_all_crds, install_crds, read_crds, upstream_crds_dir};
pub use env::{
    Env, TestNamespace, client, client_for, hack_script, kubeconfig_path, root, run_to_completion,
};
pub use process::Bitpool;
pub use wait::eventually;
