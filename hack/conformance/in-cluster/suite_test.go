// bitpool's replacement for the in-cluster provider's internal/controllers/suite_test.go.
//
// hack/conformance.sh copies the provider's module (at the version in hack/versions.env) to a
// scratch folder and puts this file in place of the provider's own suite set-up. Every spec file
// stays as upstream wrote it; what changes is who serves the claims: instead of registering the
// provider's reconcilers in this process, the suite starts the `bitpool` binary
// ($BITPOOL_BIN, `run --controllers capi-ipam`) against envtest's API server, with bitpool's
// own pool CRDs ($BITPOOL_CRDS) and only the Cluster API CRDs a cluster without Metal3 has.
// The specs judge through the API server alone, with their own timeouts.
package controllers

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/envtest/komega"

	v1alpha2 "sigs.k8s.io/cluster-api-ipam-provider-in-cluster/api/v1alpha2"
)

// The names the spec files use.
var (
	cfg       *rest.Config
	k8sClient client.Client
	testEnv   *envtest.Environment
	ctx       context.Context
	cancelCtx func()
)

// The bitpool process serving the specs.
var server *exec.Cmd

func TestAPIs(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "in-cluster provider controller specs against bitpool")
}

var _ = BeforeSuite(func() {
	ctx, cancelCtx = context.WithCancel(context.Background())
	binary := requiredEnv("BITPOOL_BIN")
	crds := strings.Split(requiredEnv("BITPOOL_CRDS"), ",")

	testEnv = &envtest.Environment{
		CRDInstallOptions: envtest.CRDInstallOptions{
			// The provider's test CRDs: IPAddressClaim, IPAddress and Cluster, as Cluster API
			// core installs them. No Metal3 CRD: bitpool must serve without one.
			Paths:              append(crds, filepath.Join("..", "..", "config", "crd", "test")),
			ErrorIfPathMissing: true,
		},
		ControlPlaneStopTimeout: 60 * time.Second,
	}
	var err error
	cfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred())

	Expect(v1alpha2.AddToScheme(scheme.Scheme)).To(Succeed())
	Expect(clusterv1.AddToScheme(scheme.Scheme)).To(Succeed())
	Expect(ipamv1.AddToScheme(scheme.Scheme)).To(Succeed())
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme.Scheme})
	Expect(err).NotTo(HaveOccurred())
	komega.SetClient(k8sClient)

	server = startBitpool(binary)
})

var _ = AfterSuite(func() {
	if server != nil && server.Process != nil {
		_ = server.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- server.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = server.Process.Kill()
		}
	}
	if cancelCtx != nil {
		cancelCtx()
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})

func requiredEnv(name string) string {
	value := os.Getenv(name)
	if value == "" {
		Fail(fmt.Sprintf("%s is not set: run this suite through bitpool's hack/conformance.sh", name))
	}
	return value
}

// startBitpool runs `bitpool run --controllers capi-ipam` as an administrator of envtest's API
// server and waits until it reports ready (every watch cache holds its initial list).
func startBitpool(binary string) *exec.Cmd {
	admin, err := testEnv.AddUser(envtest.User{Name: "bitpool", Groups: []string{"system:masters"}}, nil)
	Expect(err).NotTo(HaveOccurred())
	kubeconfig, err := admin.KubeConfig()
	Expect(err).NotTo(HaveOccurred())
	dir, err := os.MkdirTemp("", "bitpool-conformance-")
	Expect(err).NotTo(HaveOccurred())
	kubeconfigPath := filepath.Join(dir, "kubeconfig")
	Expect(os.WriteFile(kubeconfigPath, kubeconfig, 0o600)).To(Succeed())

	logPath := os.Getenv("BITPOOL_LOG")
	if logPath == "" {
		logPath = filepath.Join(dir, "bitpool.log")
	}
	logFile, err := os.Create(logPath)
	Expect(err).NotTo(HaveOccurred())
	health := freeAddress()

	cmd := exec.Command(binary, "run", "--controllers", "capi-ipam")
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+kubeconfigPath,
		"BITPOOL_HEALTH_ADDR="+health,
		"BITPOOL_WEBHOOK_PORT=0",
		"BITPOOL_DIAGNOSTICS_ADDRESS=0",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	Expect(cmd.Start()).To(Succeed())
	fmt.Fprintf(GinkgoWriter, "bitpool (pid %d) logs to %s\n", cmd.Process.Pid, logPath)

	Eventually(func() error {
		response, err := http.Get("http://" + health + "/readyz")
		if err != nil {
			return err
		}
		defer response.Body.Close()
		if response.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz answered %s", response.Status)
		}
		return nil
	}).WithTimeout(60*time.Second).WithPolling(100*time.Millisecond).Should(Succeed(),
		"bitpool did not become ready; its log: %s", logPath)
	return cmd
}

// freeAddress is a loopback address with a port nothing listens on now.
func freeAddress() string {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	defer listener.Close()
	return listener.Addr().String()
}

// newClaim is the claim the spec files build: `name` in `namespace`, naming a pool of
// bitpool's API group.
func newClaim(name, namespace, poolKind, poolName string) ipamv1.IPAddressClaim {
	return ipamv1.IPAddressClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: ipamv1.IPAddressClaimSpec{
			PoolRef: ipamv1.IPPoolReference{
				APIGroup: v1alpha2.GroupVersion.Group,
				Kind:     poolKind,
				Name:     poolName,
			},
		},
	}
}
