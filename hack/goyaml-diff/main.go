// Command goyaml-diff prints what sigs.k8s.io/yaml (CAPM3's YAML writer) makes of the JSON
// document on stdin. hack/goyaml-diff.sh compares it with bitpool's writer on random documents.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"sigs.k8s.io/yaml"
)

func main() {
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var doc interface{}
	if err := json.Unmarshal(in, &doc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Stdout.Write(out)
}
