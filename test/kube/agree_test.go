package kube

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/allocator"
	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// svcRef is a Service that holds an item (a ClusterIP, or a NodePort as a number).
type svcRef struct {
	ns, name, uid string
}

func (s svcRef) String() string { return s.ns + "/" + s.name + " (" + s.uid + ")" }

// clusterState is what a cluster's Services hold: item → the Services holding it.
type clusterState map[string][]svcRef

// clusterHolds lists every Service of the cluster: each of its ClusterIPs, NodePorts
// and its healthCheckNodePort is an item it holds.
func clusterHolds(ctx context.Context, cs kubernetes.Interface) (clusterState, error) {
	out := clusterState{}
	opts := metav1.ListOptions{Limit: 500}
	for {
		list, err := cs.CoreV1().Services("").List(ctx, opts)
		if err != nil {
			return nil, err
		}
		for i := range list.Items {
			for _, item := range heldItems(&list.Items[i]) {
				s := &list.Items[i]
				out[item] = append(out[item], svcRef{s.Namespace, s.Name, string(s.UID)})
			}
		}
		if list.Continue == "" {
			return out, nil
		}
		opts.Continue = list.Continue
	}
}

// heldItems are the ClusterIPs, NodePorts and healthCheckNodePort of s, each once
// (ports of one number share a NodePort).
func heldItems(s *corev1.Service) []string {
	var out []string
	add := func(item string) {
		if !slices.Contains(out, item) {
			out = append(out, item)
		}
	}
	for _, ip := range s.Spec.ClusterIPs {
		if ip != "" && ip != corev1.ClusterIPNone {
			add(ip)
		}
	}
	for _, p := range s.Spec.Ports {
		if p.NodePort != 0 {
			add(fmt.Sprint(p.NodePort))
		}
	}
	if s.Spec.HealthCheckNodePort != 0 {
		add(fmt.Sprint(s.Spec.HealthCheckNodePort))
	}
	return out
}

// allocdState is what allocd holds: item → its allocation.
type allocdState map[string]*allocdv1.Allocation

// allocdHolds lists every allocation of allocd.
func allocdHolds(ctx context.Context, c *client.Client) (allocdState, error) {
	out := allocdState{}
	req := &allocdv1.ListAllocationsRequest{PageSize: 5000}
	for {
		resp, err := c.ListAllocations(ctx, req)
		if err != nil {
			return nil, err
		}
		for _, a := range resp.GetAllocations() {
			item := a.GetClusterIp()
			if item == "" {
				item = fmt.Sprint(a.GetNodePort())
			}
			out[item] = a
		}
		if resp.GetNextPageToken() == "" {
			return out, nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// provisionalPrefix is the UID prefix of the webhook's provisional owners: what it
// allocated at admission, before the Service had a UID.
const provisionalPrefix = "admission/"

// disagreement is how allocd and a cluster differ, item by item.
type disagreement struct {
	twice       []string // items two Services of the cluster hold
	missing     []string // the cluster holds, allocd does not
	otherOwner  []string // both hold, allocd under another owner
	provisional []string // allocd holds for a provisional owner, the cluster for nobody
	extra       []string // allocd holds for a Service owner, the cluster for nobody
}

// none reports whether allocd and the cluster agree exactly.
func (d disagreement) none() bool {
	return len(d.twice)+len(d.missing)+len(d.otherOwner)+len(d.provisional)+len(d.extra) == 0
}

// String lists the differences, at most 10 of each kind.
func (d disagreement) String() string {
	if d.none() {
		return "none"
	}
	var b strings.Builder
	for _, k := range []struct {
		what  string
		items []string
	}{{"held twice in the cluster", d.twice}, {"missing in allocd", d.missing},
		{"allocd's owner differs", d.otherOwner},
		{"held in allocd by a provisional owner only", d.provisional},
		{"held in allocd only", d.extra}} {
		if len(k.items) == 0 {
			continue
		}
		sort.Strings(k.items)
		first := k.items[:min(10, len(k.items))]
		fmt.Fprintf(&b, "%s: %d: %s", k.what, len(k.items), strings.Join(first, ", "))
		if len(k.items) > 10 {
			b.WriteString(", ...")
		}
		b.WriteString("; ")
	}
	return strings.TrimSuffix(b.String(), "; ")
}

// compareHolds says how allocd differs from the cluster: exact agreement is every item
// a Service holds held in allocd by that Service's UID, and nothing else (the address
// allocd reserves for default/kubernetes aside, under allocd's own owner).
func compareHolds(cl clusterState, al allocdState) disagreement {
	var d disagreement
	for item, holders := range cl {
		if len(holders) > 1 {
			d.twice = append(d.twice, fmt.Sprintf("%s by %v", item, holders))
		}
		want := holders[0].uid
		if holders[0].ns == "default" && holders[0].name == "kubernetes" {
			want = allocator.KubernetesOwner.UID
		}
		a, ok := al[item]
		switch {
		case !ok:
			d.missing = append(d.missing, fmt.Sprintf("%s of %s", item, holders[0]))
		case a.GetOwner().GetUid() != want:
			o := a.GetOwner()
			d.otherOwner = append(d.otherOwner, fmt.Sprintf("%s of %s: allocd's owner %s/%s (%s)", item,
				holders[0], o.GetNamespace(), o.GetName(), o.GetUid()))
		}
	}
	for item, a := range al {
		if _, ok := cl[item]; ok {
			continue
		}
		o := a.GetOwner()
		s := fmt.Sprintf("%s by %s/%s (%s)", item, o.GetNamespace(), o.GetName(), o.GetUid())
		if strings.HasPrefix(o.GetUid(), provisionalPrefix) {
			d.provisional = append(d.provisional, s)
		} else {
			d.extra = append(d.extra, s)
		}
	}
	return d
}

// checkIPAddresses compares kube-apiserver's own bookkeeping of ClusterIPs, its
// IPAddress objects, with what the Services hold: every ClusterIP of a Service has an
// IPAddress whose parentRef is that Service, and every IPAddress of kube-apiserver's
// allocator has a Service that holds its address. It returns the differences.
func checkIPAddresses(ctx context.Context, cs kubernetes.Interface, cl clusterState) ([]string, error) {
	ips := map[string]networkingv1.IPAddress{}
	opts := metav1.ListOptions{Limit: 1000}
	for {
		list, err := cs.NetworkingV1().IPAddresses().List(ctx, opts)
		if err != nil {
			return nil, err
		}
		for _, ip := range list.Items {
			ips[ip.Name] = ip
		}
		if list.Continue == "" {
			break
		}
		opts.Continue = list.Continue
	}
	var out []string
	for item, holders := range cl {
		addr, err := netip.ParseAddr(item)
		if err != nil {
			continue // a NodePort
		}
		ip, ok := ips[addr.String()]
		ref := ip.Spec.ParentRef
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s of %s: no IPAddress", item, holders[0]))
		case ref == nil || ref.Resource != "services" || ref.Namespace != holders[0].ns ||
			ref.Name != holders[0].name:
			out = append(out, fmt.Sprintf("%s of %s: IPAddress's parentRef %+v", item, holders[0], ref))
		}
	}
	for name, ip := range ips {
		if ip.Labels[networkingv1.LabelManagedBy] != "ipallocator.k8s.io" {
			continue
		}
		if _, ok := cl[name]; !ok {
			out = append(out, fmt.Sprintf("IPAddress %s of %+v: no Service holds it", name,
				ip.Spec.ParentRef))
		}
	}
	sort.Strings(out)
	return out, nil
}

// decidedCount tells, for every item of the Services of namespace ns, whether allocd
// allocated it before kube-apiserver stored the Service (allocd's item key created at
// an etcd revision before the Service's key: allocd decided it at admission) or after
// (adopted from kube-apiserver's own allocation). allocd and the cluster share the
// test's etcd, so their revisions are one clock. It returns the items decided and
// those adopted, and the items allocd does not hold.
func decidedCount(ctx context.Context, etcd *clientv3.Client, clusterPrefix, ns string, cl clusterState,
	al allocdState) (decided, adopted, unheld []string, err error) {
	created := map[string]int64{}
	for item, holders := range cl {
		h := holders[0]
		if h.ns != ns {
			continue
		}
		rev, ok := created[h.name]
		if !ok {
			resp, err := etcd.Get(ctx, clusterPrefix+"/services/specs/"+h.ns+"/"+h.name)
			if err != nil {
				return nil, nil, nil, err
			}
			if len(resp.Kvs) == 0 {
				return nil, nil, nil, fmt.Errorf("Service %s: no key in etcd under %s", h, clusterPrefix)
			}
			rev = resp.Kvs[0].CreateRevision
			created[h.name] = rev
		}
		a, ok := al[item]
		switch {
		case !ok:
			unheld = append(unheld, item)
		case a.GetCreateRevision() < rev:
			decided = append(decided, item)
		default:
			adopted = append(adopted, fmt.Sprintf("%s of %s (allocd's revision %d, the Service's %d)",
				item, h, a.GetCreateRevision(), rev))
		}
	}
	return decided, adopted, unheld, nil
}
