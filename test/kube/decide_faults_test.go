package kube

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// allocdLeader is the index in s.Replicas of the replica that leads allocd's election
// (the oldest key under <prefix>/repair/leader holds its advertise address), read
// from etcd.
func allocdLeader(ctx context.Context, etcd *clientv3.Client, s *allocdSide) (int, error) {
	resp, err := etcd.Get(ctx, "/allocd/repair/leader/", clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
	if err != nil {
		return -1, err
	}
	if len(resp.Kvs) == 0 {
		return -1, errors.New("no allocd replica leads")
	}
	for i, a := range s.Addrs {
		if a == string(resp.Kvs[0].Value) {
			return i, nil
		}
	}
	return -1, fmt.Errorf("the leader %q is none of the replicas %v", resp.Kvs[0].Value, s.Addrs)
}

// createHook runs fn (in a goroutine of its own, which the run waits for) once after
// creates have been answered.
type createHook struct {
	after int
	fn    func()
}

// runCreatesHooked is runCreates with hooks: faults injected part way through.
func runCreatesHooked(ctx context.Context, cs kubernetes.Interface, n, clients int,
	obj func(i int) *corev1.Service, hooks ...createHook) *createRun {
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered := 0
	run := runCreatesNotify(ctx, cs, n, clients, obj, func() {
		mu.Lock()
		answered++
		a := answered
		mu.Unlock()
		for _, h := range hooks {
			if h.after == a {
				wg.Go(h.fn)
			}
		}
	})
	wg.Wait()
	return run
}

// provisionalWatch follows the webhook's provisional owners in allocd (owner UIDs
// "admission/..."), polling every 100 ms: when each item was first and last seen held
// by one. It stops with its context.
type provisionalWatch struct {
	mu    sync.Mutex
	first map[string]time.Time
	last  map[string]time.Time
	done  chan struct{}
}

func watchProvisional(ctx context.Context, c *client.Client) *provisionalWatch {
	w := &provisionalWatch{first: map[string]time.Time{}, last: map[string]time.Time{},
		done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			req := &allocdv1.ListAllocationsRequest{OwnerUidPrefix: provisionalPrefix, PageSize: 5000}
			resp, err := c.ListAllocations(ctx, req)
			now := time.Now()
			if err == nil {
				w.mu.Lock()
				for _, a := range resp.GetAllocations() {
					item := a.GetClusterIp()
					if item == "" {
						item = fmt.Sprint(a.GetNodePort())
					}
					o := a.GetOwner()
					key := o.GetNamespace() + "/" + o.GetName() + " " + o.GetUid() + " " + item
					if _, ok := w.first[key]; !ok {
						w.first[key] = a.GetAllocateTime().AsTime()
					}
					w.last[key] = now
				}
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return w
}

// held is how long each item of a provisional owner named one of names (namespace/name)
// was held by it, longest first: from its allocation to the last time it was seen. It
// waits for the watch to stop.
func (w *provisionalWatch) held(names map[string]bool) []time.Duration {
	<-w.done
	var out []time.Duration
	for k, f := range w.first {
		if name, _, _ := strings.Cut(k, " "); names[name] {
			out = append(out, w.last[k].Sub(f))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] > out[j] })
	return out
}

// quotaNS is the namespace whose ResourceQuota refuses Services after quotaServices.
const (
	quotaNS       = "quota"
	quotaServices = 5
)

// setQuota makes namespace quotaNS allow quotaServices Services, and waits until the
// quota's status counts them (kube-apiserver's quota admission refuses nothing before).
func setQuota(ctx context.Context, cs kubernetes.Interface) error {
	q := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: quotaNS, Name: "services"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{
			corev1.ResourceServices: resource.MustParse(fmt.Sprint(quotaServices))}},
	}
	if _, err := cs.CoreV1().ResourceQuotas(quotaNS).Create(ctx, q, metav1.CreateOptions{}); err != nil {
		return err
	}
	// No kube-controller-manager runs to fill in the status: set it as its quota
	// controller would (nothing used yet).
	q.Status = corev1.ResourceQuotaStatus{Hard: q.Spec.Hard, Used: corev1.ResourceList{
		corev1.ResourceServices: resource.MustParse("0")}}
	got, err := cs.CoreV1().ResourceQuotas(quotaNS).Get(ctx, q.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	got.Status = q.Status
	_, err = cs.CoreV1().ResourceQuotas(quotaNS).UpdateStatus(ctx, got, metav1.UpdateOptions{})
	return err
}

// denyLabel on a Service makes the e2e's ValidatingAdmissionPolicy refuse its create.
const denyLabel = "allocd-e2e-deny"

// setDenyPolicy installs a ValidatingAdmissionPolicy that refuses the create of a
// Service labelled denyLabel, and waits until it does (a policy takes effect once
// kube-apiserver has compiled it).
func setDenyPolicy(ctx context.Context, cs kubernetes.Interface, ns string) error {
	rule := admissionv1.NamedRuleWithOperations{RuleWithOperations: admissionv1.RuleWithOperations{
		Operations: []admissionv1.OperationType{admissionv1.Create},
		Rule: admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"},
			Resources: []string{"services"}},
	}}
	pol := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "allocd-e2e-deny"},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionv1.MatchResources{
				ResourceRules: []admissionv1.NamedRuleWithOperations{rule}},
			Validations: []admissionv1.Validation{{
				Expression: "!has(object.metadata.labels) || " +
					"!('" + denyLabel + "' in object.metadata.labels)",
				Message: "the e2e's ValidatingAdmissionPolicy refuses Services labelled " + denyLabel,
			}},
		},
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, pol,
		metav1.CreateOptions{}); err != nil {
		return err
	}
	b := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "allocd-e2e-deny"},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: pol.Name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny}},
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, b,
		metav1.CreateOptions{}); err != nil {
		return err
	}
	probe := plainService(ns, "deny-probe")
	probe.Labels = map[string]string{denyLabel: "yes"}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	for deadline := time.Now().Add(time.Minute); ; {
		_, err := cs.CoreV1().Services(ns).Create(ctx, probe, dry)
		if err != nil && refusalReason(err) == string(metav1.StatusReasonInvalid) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the ValidatingAdmissionPolicy refused nothing within a minute (last: %v)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
