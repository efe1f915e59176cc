package validate

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// manifests is the folder of the StatefulSet deployment.
const manifests = "../statefulset"

func routes(t *testing.T) []string {
	t.Helper()
	r, err := Routes("../../..")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestManifests: every manifest decodes strictly into the k8s.io/api
// types, and the coordinator, workers, services, probes and volume fit.
func TestManifests(t *testing.T) {
	s, err := Load(manifests)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Services) != 2 || len(s.Claims) != 1 || len(s.StatefulSets) != 1 || len(s.Deployments) != 1 {
		t.Fatalf("loaded %d services, %d claims, %d statefulsets, %d deployments", len(s.Services), len(s.Claims), len(s.StatefulSets), len(s.Deployments))
	}
	for _, err := range s.Check(routes(t)) {
		t.Error(err)
	}
	if got := *s.StatefulSets[0].Spec.Replicas; got != 2 {
		t.Errorf("workers: %d replicas", got)
	}
}

// TestRoutes: the probe paths come from the server's own routes.
func TestRoutes(t *testing.T) {
	r := routes(t)
	for _, want := range []string{"/health", "/v1/models", "/metrics"} {
		if !strings.Contains(" "+strings.Join(r, " ")+" ", " "+want+" ") {
			t.Errorf("routes %v lack %s", r, want)
		}
	}
}

// TestBrokenManifests: each manifest spoiled in one way (a misspelled
// field, a value of the wrong type, a rank count, a probe path, a port, a
// worker name, a loopback host) is caught, naming what is wrong. The
// spoils are edits of the real manifests, so they follow them.
func TestBrokenManifests(t *testing.T) {
	for _, c := range []struct {
		file, old, new, want string
	}{
		{"workers.yaml", "  replicas: 2\n", "  replica: 2\n", `unknown field "spec.replica"`},
		{"workers.yaml", "containerPort: 7100", "contanerPort: 7100", `unknown field "spec.template.spec.containers[0].ports[0].contanerPort"`},
		{"coordinator.yaml", "memory: 36Gi\n            limits", "memory: 36Gx\n            limits", "quantities must match"},
		{"coordinator.yaml", "kind: Deployment", "kind: Deploymnet", `kind "Deploymnet": not a kind`},
		{"coordinator.yaml", `"--tensor-parallel", "2"`, `"--tensor-parallel", "3"`, "= 3 ranks, but 2 --workers"},
		{"workers.yaml", "  replicas: 2\n", "  replicas: 3\n", "3 replicas for 2 --workers"},
		{"coordinator.yaml", "path: /health\n              port: http\n            periodSeconds: 5", "path: /healthz\n              port: http\n            periodSeconds: 5", "readiness probe asks /healthz, which is no GET route"},
		{"workers.yaml", `"0.0.0.0:7100"`, `"0.0.0.0:7101"`, "listens on port 7101, which its container does not expose"},
		{"coordinator.yaml", "pagoda-worker-1.pagoda-worker:7100", "pagoda-worker-2.pagoda-worker:7100", "worker 1 is pagoda-worker-2.pagoda-worker, want pagoda-worker-1.pagoda-worker"},
		{"coordinator.yaml", `"--host", "0.0.0.0"`, `"--host", "127.0.0.1"`, "listens on loopback only"},
		{"workers.yaml", `"--max-memory", "30GiB"`, `"--max-memory", "40GiB"`, "is not under the container's memory limit"},
		{"workers.yaml", "\n  clusterIP: None", "", "not headless"},
		{"workers.yaml", "grpc:\n              port: 7100\n            periodSeconds: 10", "grpc:\n              port: 7200\n            periodSeconds: 10", "gRPC health on port 7200, not the --listen port 7100"},
		{"workers.yaml", "grpc:\n              port: 7100\n            periodSeconds: 20", "httpGet:\n              path: /health\n              port: 7100\n            periodSeconds: 20", "neither gRPC health nor a TCP connect"},
		{"workers.yaml", "claimName: pagoda-models", "claimName: pagoda-model", `claims "pagoda-model", which no manifest defines`},
	} {
		dir := t.TempDir()
		files, _ := filepath.Glob(filepath.Join(manifests, "*.yaml"))
		found := false
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			text := string(b)
			if filepath.Base(f) == c.file {
				found = strings.Contains(text, c.old)
				text = strings.Replace(text, c.old, c.new, 1)
			}
			if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if !found {
			t.Errorf("%s no longer holds %q: update this case", c.file, c.old)
			continue
		}
		s, err := Load(dir)
		if err == nil {
			err = errors.Join(s.Check(routes(t))...)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s with %q for %q: %v, want an error with %q", c.file, c.new, c.old, err, c.want)
		}
	}
}
