package validate

import (
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Routes reads the paths the server answers GET on from its source
// (server/*.go in the repository at root): what a probe may ask.
func Routes(root string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(root, "server", "*.go"))
	if err != nil {
		return nil, err
	}
	re := regexp.MustCompile(`\.Handle(?:Func)?\("GET (/[^"{ ]*)"`)
	var routes []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			routes = append(routes, m[1])
		}
	}
	if len(routes) == 0 {
		return nil, fmt.Errorf("%s: no GET routes found in server/*.go", root)
	}
	return routes, nil
}

// command is a container running pagoda: its subcommand and flags.
type command struct {
	sub   string
	flags map[string]string
}

// boolFlags are pagoda's flags that take no value.
var boolFlags = []string{"quiet", "no-prefix-cache", "static-batching", "metrics-auth"}

// pagodaCommand parses the container's command and args, when it runs
// pagoda: "--name value" and "--name=value" (one or two dashes).
func pagodaCommand(c *corev1.Container) (*command, error) {
	argv := append(slices.Clone(c.Command), c.Args...)
	if len(argv) < 2 || filepath.Base(argv[0]) != "pagoda" {
		return nil, nil
	}
	cmd := &command{sub: argv[1], flags: map[string]string{}}
	for i := 2; i < len(argv); i++ {
		a := argv[i]
		if !strings.HasPrefix(a, "-") {
			return nil, fmt.Errorf("pagoda %s: unexpected argument %q", cmd.sub, a)
		}
		name, val, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !ok && !slices.Contains(boolFlags, name) {
			if i+1 >= len(argv) {
				return nil, fmt.Errorf("pagoda %s: %s has no value", cmd.sub, a)
			}
			i++
			val = argv[i]
		}
		if _, dup := cmd.flags[name]; dup {
			return nil, fmt.Errorf("pagoda %s: --%s given twice", cmd.sub, name)
		}
		cmd.flags[name] = val
	}
	return cmd, nil
}

// container is a pagoda container found in a workload.
type container struct {
	w   workload
	c   *corev1.Container
	cmd *command
}

func (s *Set) pagodaContainers(ws []workload, fail func(string, ...any)) (coords, workers []container) {
	for _, w := range ws {
		for i := range w.pod.Spec.Containers {
			c := &w.pod.Spec.Containers[i]
			cmd, err := pagodaCommand(c)
			if err != nil {
				fail("%s %s: container %s: %v", w.kind, w.name, c.Name, err)
				continue
			}
			switch {
			case cmd == nil:
			case cmd.sub == "serve":
				coords = append(coords, container{w, c, cmd})
			case cmd.sub == "worker":
				workers = append(workers, container{w, c, cmd})
			default:
				fail("%s %s: container %s runs pagoda %s, neither serve nor worker", w.kind, w.name, c.Name, cmd.sub)
			}
		}
	}
	return coords, workers
}

// checkGroup checks the coordinator and its workers fit together.
func (s *Set) checkGroup(ws []workload, routes []string, fail func(string, ...any)) {
	coords, workers := s.pagodaContainers(ws, fail)
	if len(coords) != 1 {
		fail("want one coordinator (pagoda serve), found %d", len(coords))
		return
	}
	co := coords[0]
	if co.w.replicas != 1 {
		fail("%s %s: %d coordinators for one set of workers (a worker serves one group at a time)", co.w.kind, co.w.name, co.w.replicas)
	}
	checkServe(co, routes, fail)
	addrs := strings.Split(co.cmd.flags["workers"], ",")
	if co.cmd.flags["workers"] == "" {
		fail("coordinator: no --workers (in a cluster the workers are started by it, not by serve)")
		return
	}
	tp, pp := intFlag(co, "tensor-parallel", fail), intFlag(co, "pipeline-parallel", fail)
	if tp*pp != len(addrs) {
		fail("coordinator: --tensor-parallel %d × --pipeline-parallel %d = %d ranks, but %d --workers", tp, pp, tp*pp, len(addrs))
	}
	s.checkWorkers(co, addrs, workers, fail)
}

func intFlag(co container, name string, fail func(string, ...any)) int {
	v, ok := co.cmd.flags[name]
	if !ok {
		return 1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		fail("coordinator: --%s %q", name, v)
		return 1
	}
	return n
}

// checkServe: serve listens beyond loopback on a port its container
// exposes, and its probes ask that port for a path the server answers.
func checkServe(co container, routes []string, fail func(string, ...any)) {
	host := co.cmd.flags["host"]
	if ip := net.ParseIP(host); host == "" || host == "localhost" || (ip != nil && ip.IsLoopback()) {
		fail("coordinator: --host %q listens on loopback only (the default): probes and the Service cannot reach it; give --host 0.0.0.0", host)
	}
	port, err := strconv.Atoi(co.cmd.flags["port"])
	if err != nil {
		port = 8000 // serve's default
	}
	if findPort(co.w.pod, intstr.FromInt(port)) == nil {
		fail("coordinator: serve listens on port %d, which its container does not expose", port)
	}
	probes := map[string]*corev1.Probe{"readiness": co.c.ReadinessProbe, "liveness": co.c.LivenessProbe, "startup": co.c.StartupProbe}
	for _, kind := range []string{"readiness", "liveness", "startup"} {
		p := probes[kind]
		if p == nil {
			if kind != "startup" {
				fail("coordinator: no %s probe", kind)
			}
			continue
		}
		if p.HTTPGet == nil {
			fail("coordinator: the %s probe is not an HTTP GET", kind)
			continue
		}
		if !slices.Contains(routes, p.HTTPGet.Path) {
			fail("coordinator: the %s probe asks %s, which is no GET route of the server (%s)", kind, p.HTTPGet.Path, strings.Join(routes, " "))
		}
		if cp := findPort(co.w.pod, p.HTTPGet.Port); cp == nil || int(cp.ContainerPort) != port {
			fail("coordinator: the %s probe asks port %s, not serve's --port %d", kind, p.HTTPGet.Port.String(), port)
		}
	}
	checkCap(co, fail)
}

// checkWorkerProbes: a worker's probes ask its one port, by its gRPC
// health service or a TCP connect; it answers nothing else (no HTTP).
func checkWorkerProbes(wk container, listen int, fail func(string, ...any)) {
	probes := map[string]*corev1.Probe{"readiness": wk.c.ReadinessProbe, "liveness": wk.c.LivenessProbe, "startup": wk.c.StartupProbe}
	for _, kind := range []string{"readiness", "liveness", "startup"} {
		p := probes[kind]
		switch {
		case p == nil:
		case p.GRPC != nil:
			if int(p.GRPC.Port) != listen {
				fail("worker: the %s probe asks gRPC health on port %d, not the --listen port %d", kind, p.GRPC.Port, listen)
			}
		case p.TCPSocket != nil:
			if cp := findPort(wk.w.pod, p.TCPSocket.Port); cp == nil || int(cp.ContainerPort) != listen {
				fail("worker: the %s probe connects to port %s, not the --listen port %d", kind, p.TCPSocket.Port.String(), listen)
			}
		default:
			fail("worker: the %s probe is neither gRPC health nor a TCP connect (a worker serves no HTTP)", kind)
		}
	}
}

// checkWorkers: --workers names the StatefulSet's pods in order, under
// its headless Service, on the port the workers listen on and expose;
// its replicas are the ranks; every pagoda opens the same model file
// from a mounted claim.
func (s *Set) checkWorkers(co container, addrs []string, workers []container, fail func(string, ...any)) {
	if len(workers) != 1 || workers[0].w.sts == nil {
		fail("want the workers (pagoda worker) as one StatefulSet, found %d worker containers", len(workers))
		return
	}
	wk := workers[0]
	sts := wk.w.sts
	if int(wk.w.replicas) != len(addrs) {
		fail("StatefulSet %s: %d replicas for %d --workers", sts.Name, wk.w.replicas, len(addrs))
	}
	_, lport, err := net.SplitHostPort(wk.cmd.flags["listen"])
	if err != nil {
		fail("worker: --listen %q: %v", wk.cmd.flags["listen"], err)
		return
	}
	listen, _ := strconv.Atoi(lport)
	if findPort(wk.w.pod, intstr.FromInt(listen)) == nil {
		fail("worker: listens on port %d, which its container does not expose", listen)
	}
	checkWorkerProbes(wk, listen, fail)
	svc := s.service(sts.Spec.ServiceName)
	switch {
	case svc == nil:
		fail("StatefulSet %s: serviceName %q is no Service here", sts.Name, sts.Spec.ServiceName)
	case svc.Spec.ClusterIP != corev1.ClusterIPNone:
		fail("Service %s: not headless (clusterIP: None): the workers get no names of their own", svc.Name)
	}
	for i, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		want := fmt.Sprintf("%s-%d.%s", sts.Name, i, sts.Spec.ServiceName)
		switch {
		case err != nil:
			fail("coordinator: --workers %q: %v", a, err)
		case host != want && !strings.HasPrefix(host, want+"."):
			fail("coordinator: worker %d is %s, want %s (the StatefulSet's pod %d, in rank order)", i, host, want, i)
		case port != lport:
			fail("coordinator: worker %d at port %s, but the workers listen on %s", i, port, lport)
		}
	}
	model := co.cmd.flags["m"]
	for _, c := range []container{co, wk} {
		if c.cmd.flags["m"] != model || model == "" {
			fail("%s %s: -m %q, the coordinator's is %q: every rank opens the same file", c.w.kind, c.w.name, c.cmd.flags["m"], model)
		}
		if !mounted(c, model) {
			fail("%s %s: -m %s is under no volume mount backed by a PersistentVolumeClaim", c.w.kind, c.w.name, model)
		}
	}
	checkCap(wk, fail)
}

func (s *Set) service(name string) *corev1.Service {
	for _, svc := range s.Services {
		if svc.Name == name {
			return svc
		}
	}
	return nil
}

// mounted says whether path lies under a mount of a claim's volume.
func mounted(c container, path string) bool {
	claims := map[string]bool{}
	for _, v := range c.w.pod.Spec.Volumes {
		claims[v.Name] = v.PersistentVolumeClaim != nil
	}
	for _, m := range c.c.VolumeMounts {
		if claims[m.Name] && strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
			return true
		}
	}
	return false
}

// checkCap: a --max-memory under the container's memory limit, which
// must then be set.
func checkCap(c container, fail func(string, ...any)) {
	v, ok := c.cmd.flags["max-memory"]
	if !ok {
		return
	}
	n, err := parseBytes(v)
	limit := memoryLimit(c.c)
	switch {
	case err != nil:
		fail("%s %s: --max-memory: %v", c.w.kind, c.w.name, err)
	case limit == 0:
		fail("%s %s: --max-memory %s without a memory limit on the container", c.w.kind, c.w.name, v)
	case n >= limit:
		fail("%s %s: --max-memory %s is not under the container's memory limit of %d bytes (the runtime and scratch come on top)", c.w.kind, c.w.name, v, limit)
	}
}

// parseBytes reads pagoda's sizes (cmd/pagoda parseBytes): "30GiB",
// "512MiB", "2GB", a plain count.
func parseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   float64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}
	t, mult := strings.TrimSpace(s), 1.0
	for _, u := range units {
		if strings.HasSuffix(strings.ToUpper(t), strings.ToUpper(u.suffix)) {
			t, mult = strings.TrimSpace(t[:len(t)-len(u.suffix)]), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || !(v >= 0 && v*mult <= math.MaxInt64/2) {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return int64(v * mult), nil
}
