// Package validate checks Pagoda's Kubernetes manifests (deploy/k8s)
// against the real API types of k8s.io/api, decoding every document
// strictly (an unknown or misspelled field is an error), and then checks
// what the types cannot: that the coordinator's flags, the workers'
// names, ports, probes and volumes fit together.
//
// It is a module of its own so that the engine's module takes no
// Kubernetes dependency.
package validate

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Set is the objects of one deployment (a folder of manifests).
type Set struct {
	Services     []*corev1.Service
	Claims       []*corev1.PersistentVolumeClaim
	StatefulSets []*appsv1.StatefulSet
	Deployments  []*appsv1.Deployment
}

// Load decodes every document of every *.yaml file in dir strictly into
// its API type.
func Load(dir string) (*Set, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no *.yaml manifests", dir)
	}
	sort.Strings(files)
	s := &Set{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for i, doc := range splitDocs(b) {
			if err := s.add(doc); err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", filepath.Base(f), i+1, err)
			}
		}
	}
	return s, nil
}

// splitDocs cuts a YAML stream at its "---" lines, dropping documents
// that hold only comments.
func splitDocs(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		for _, line := range strings.Split(d, "\n") {
			if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
				docs = append(docs, []byte(d))
				break
			}
		}
	}
	return docs
}

func (s *Set) add(doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	var obj any
	switch tm.APIVersion + " " + tm.Kind {
	case "v1 Service":
		o := &corev1.Service{}
		s.Services, obj = append(s.Services, o), o
	case "v1 PersistentVolumeClaim":
		o := &corev1.PersistentVolumeClaim{}
		s.Claims, obj = append(s.Claims, o), o
	case "apps/v1 StatefulSet":
		o := &appsv1.StatefulSet{}
		s.StatefulSets, obj = append(s.StatefulSets, o), o
	case "apps/v1 Deployment":
		o := &appsv1.Deployment{}
		s.Deployments, obj = append(s.Deployments, o), o
	default:
		return fmt.Errorf("apiVersion %q kind %q: not a kind these manifests use", tm.APIVersion, tm.Kind)
	}
	// Strict: unknown fields (named by their path), duplicate fields and
	// values of the wrong type (a quantity that does not parse) are
	// errors, as the API server's strict field validation reports them.
	if _, _, err := strictDecoder.Decode(doc, nil, obj.(runtime.Object)); err != nil {
		return fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return nil
}

// strictDecoder is apimachinery's YAML serializer in strict mode over a
// scheme of the kinds the manifests use.
var strictDecoder = func() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	return kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme, kjson.SerializerOptions{Yaml: true, Strict: true})
}()

// workload is a Deployment's or StatefulSet's pod template, as the checks
// see both.
type workload struct {
	kind, name string
	selector   *metav1.LabelSelector
	pod        *corev1.PodTemplateSpec
	replicas   int32
	sts        *appsv1.StatefulSet
}

func (s *Set) workloads() []workload {
	var ws []workload
	for _, d := range s.Deployments {
		ws = append(ws, workload{"Deployment", d.Name, d.Spec.Selector, &d.Spec.Template, replicas(d.Spec.Replicas), nil})
	}
	for _, st := range s.StatefulSets {
		ws = append(ws, workload{"StatefulSet", st.Name, st.Spec.Selector, &st.Spec.Template, replicas(st.Spec.Replicas), st})
	}
	return ws
}

func replicas(p *int32) int32 {
	if p == nil {
		return 1 // the API's default
	}
	return *p
}

// Check runs the semantic checks; routes are the HTTP paths the server
// answers GET on. It returns every problem found.
func (s *Set) Check(routes []string) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	s.checkNames(fail)
	ws := s.workloads()
	for _, w := range ws {
		checkWorkload(w, s, fail)
	}
	for _, svc := range s.Services {
		checkService(svc, ws, fail)
	}
	s.checkGroup(ws, routes, fail)
	return errs
}

func (s *Set) checkNames(fail func(string, ...any)) {
	check := func(kind, name string, msgs []string) {
		if len(msgs) > 0 {
			fail("%s %q: name: %s", kind, name, strings.Join(msgs, "; "))
		}
	}
	for _, o := range s.Services {
		check("Service", o.Name, validation.IsDNS1035Label(o.Name))
	}
	for _, o := range s.Claims {
		check("PersistentVolumeClaim", o.Name, validation.IsDNS1123Subdomain(o.Name))
	}
	for _, o := range s.Deployments {
		check("Deployment", o.Name, validation.IsDNS1123Subdomain(o.Name))
	}
	for _, o := range s.StatefulSets {
		// Its pods' names (name-N) are DNS labels under the Service.
		check("StatefulSet", o.Name, validation.IsDNS1123Label(o.Name+"-0"))
	}
}

// checkWorkload: the selector picks the template's pods, every container
// requests CPU and memory, and every volume and mount is backed.
func checkWorkload(w workload, s *Set, fail func(string, ...any)) {
	sel, err := metav1.LabelSelectorAsSelector(w.selector)
	switch {
	case w.selector == nil || err != nil:
		fail("%s %s: selector: %v", w.kind, w.name, err)
	case sel.Empty() || !sel.Matches(labels.Set(w.pod.Labels)):
		fail("%s %s: selector %v does not select its own pods (labels %v)", w.kind, w.name, sel, w.pod.Labels)
	}
	if w.replicas < 1 {
		fail("%s %s: %d replicas", w.kind, w.name, w.replicas)
	}
	vols := map[string]bool{}
	for _, v := range w.pod.Spec.Volumes {
		vols[v.Name] = true
		if c := v.PersistentVolumeClaim; c != nil && !slices.ContainsFunc(s.Claims, func(p *corev1.PersistentVolumeClaim) bool { return p.Name == c.ClaimName }) {
			fail("%s %s: volume %s claims %q, which no manifest defines", w.kind, w.name, v.Name, c.ClaimName)
		}
	}
	if len(w.pod.Spec.Containers) == 0 {
		fail("%s %s: no containers", w.kind, w.name)
	}
	for _, c := range w.pod.Spec.Containers {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := c.Resources.Requests[r]; !ok || q.Sign() <= 0 {
				fail("%s %s: container %s requests no %s", w.kind, w.name, c.Name, r)
			}
		}
		for _, m := range c.VolumeMounts {
			if !vols[m.Name] {
				fail("%s %s: container %s mounts %q, which is no volume of the pod", w.kind, w.name, c.Name, m.Name)
			}
		}
	}
}

// checkService: the Service selects some workload's pods and each port's
// target is one of their container ports.
func checkService(svc *corev1.Service, ws []workload, fail func(string, ...any)) {
	if len(svc.Spec.Selector) == 0 {
		fail("Service %s: no selector", svc.Name)
		return
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	var pods []*corev1.PodTemplateSpec
	for _, w := range ws {
		if sel.Matches(labels.Set(w.pod.Labels)) {
			pods = append(pods, w.pod)
		}
	}
	if len(pods) == 0 {
		fail("Service %s: selector %v matches no workload's pods", svc.Name, sel)
		return
	}
	for _, p := range svc.Spec.Ports {
		target := p.TargetPort
		if target.IntVal == 0 && target.StrVal == "" {
			target = intstr.FromInt32(p.Port)
		}
		for _, pod := range pods {
			if findPort(pod, target) == nil {
				fail("Service %s: port %s targets %s, which no container of its pods (%s) exposes", svc.Name, p.Name, target.String(), pod.Labels)
			}
		}
	}
}

// findPort is the container port a named or numbered target refers to.
func findPort(pod *corev1.PodTemplateSpec, target intstr.IntOrString) *corev1.ContainerPort {
	for ci := range pod.Spec.Containers {
		for pi := range pod.Spec.Containers[ci].Ports {
			p := &pod.Spec.Containers[ci].Ports[pi]
			if (target.Type == intstr.String && p.Name == target.StrVal) || (target.Type == intstr.Int && p.ContainerPort == target.IntVal) {
				return p
			}
		}
	}
	return nil
}

// memoryLimit is a container's memory limit in bytes (0: none).
func memoryLimit(c *corev1.Container) int64 {
	if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		return q.Value()
	}
	return 0
}
