// Not built: its go.sum pins the checksums of the upstream modules whose CRDs the tests install
// (hack/upstream-crds.sh downloads them from here, so every download is verified against it).
module bitpool.test/upstream

go 1.26
