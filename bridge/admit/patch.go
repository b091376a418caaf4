package admit

import (
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// op is one JSON Patch (RFC 6902) operation.
type op struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// patch is the JSON Patch that writes what allocd allocated into orig, the object as
// the webhook received it: spec.clusterIP, spec.clusterIPs and spec.ipFamilies when an
// address was allocated, the node port of each port that lacked one, and
// spec.healthCheckNodePort; a field that already holds its value is left out, so that
// a reinvocation that finds its values in place patches nothing. "add" sets a member
// whether it exists or not.
func (n *need) patch(orig *corev1.Service) []op {
	var ops []op
	if len(n.ips) > 0 {
		ips := slices.Clone(n.svc.Spec.ClusterIPs)
		for _, ip := range n.ips {
			if ips[ip.index] == "" {
				ips[ip.index] = ip.got.String()
			}
		}
		if orig.Spec.ClusterIP != ips[0] {
			ops = append(ops, op{Op: "add", Path: "/spec/clusterIP", Value: ips[0]})
		}
		if !slices.Equal(orig.Spec.ClusterIPs, ips) {
			ops = append(ops, op{Op: "add", Path: "/spec/clusterIPs", Value: ips})
		}
		if !slices.Equal(orig.Spec.IPFamilies, n.svc.Spec.IPFamilies) {
			ops = append(ops, op{Op: "add", Path: "/spec/ipFamilies", Value: n.svc.Spec.IPFamilies})
		}
	}
	for _, p := range n.ports {
		if p.hc {
			if orig.Spec.HealthCheckNodePort != p.got {
				ops = append(ops, op{Op: "add", Path: "/spec/healthCheckNodePort", Value: p.got})
			}
			continue
		}
		for _, i := range p.fill {
			if orig.Spec.Ports[i].NodePort != p.got {
				path := fmt.Sprintf("/spec/ports/%d/nodePort", i)
				ops = append(ops, op{Op: "add", Path: path, Value: p.got})
			}
		}
	}
	return ops
}

// encodePatch is the patch's JSON, or nil when it has no operation.
func encodePatch(ops []op) ([]byte, error) {
	if len(ops) == 0 {
		return nil, nil
	}
	return json.Marshal(ops)
}
