package server_test

import (
	"slices"
	"strconv"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// TestAllocatorServiceTransfer: a provisional owner's items move to the Service's UID
// (a retry moves nothing, revision 0), and the owners of a UID prefix are listed; bad
// requests are INVALID_ARGUMENT naming the fields, an item from does not hold
// FAILED_PRECONDITION naming its holder (or saying it is free), and nothing moves.
func TestAllocatorServiceTransfer(t *testing.T) {
	e := etcdtest.New(t)
	c := startAllocatorServer(t, e, "10.0.0.0/24")
	ctx := etcdtest.Context(t)
	provisional := &allocdv1.Owner{Namespace: "default", Name: "web", Uid: "admission/7f3a"}
	got, err := c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: provisional, NodePortCount: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: own("other"),
		NodePorts: []int32{30050}}); err != nil {
		t.Fatal(err)
	}
	list, err := c.ListAllocations(ctx, &allocdv1.ListAllocationsRequest{OwnerUidPrefix: "admission/"})
	if err != nil || len(list.GetAllocations()) != 2 ||
		list.GetAllocations()[0].GetOwner().GetUid() != provisional.Uid {
		t.Errorf("ListAllocations(prefix admission/) = %v, %v; want the provisional owner's 2", list, err)
	}

	bad := []struct {
		name   string
		req    *allocdv1.TransferRequest
		fields []string
	}{
		{"no owners", &allocdv1.TransferRequest{}, []string{"from", "to"}},
		{"no uids", &allocdv1.TransferRequest{From: &allocdv1.Owner{Name: "x"},
			To: &allocdv1.Owner{Name: "y"}}, []string{"from.uid", "to.uid"}},
		{"from is to", &allocdv1.TransferRequest{From: provisional, To: provisional}, []string{"to.uid"}},
		{"bad items", &allocdv1.TransferRequest{From: provisional, To: own("web"), ClusterIps: []string{"x"},
			NodePorts: []int32{0}}, []string{"cluster_ips[0]", "node_ports[0]"}},
		{"outside the range", &allocdv1.TransferRequest{From: provisional, To: own("web"),
			NodePorts: []int32{8080}}, []string{"node_ports"}},
	}
	for _, tc := range bad {
		_, err := c.Transfer(ctx, tc.req)
		var fields []string
		if br, ok := detail[*errdetails.BadRequest](err); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
		if status.Code(err) != codes.InvalidArgument || !slices.Equal(fields, tc.fields) {
			t.Errorf("%s: Transfer(%v) = %v (fields %v); want INVALID_ARGUMENT with fields %v", tc.name,
				tc.req, err, fields, tc.fields)
		}
	}
	notHeld := []struct {
		name   string
		port   int32
		holder map[string]string // ErrorInfo metadata that must be there
	}{
		{"another owner's", 30050,
			map[string]string{"holder_uid": "other", "holder": "default/svc-other other"}},
		{"free", 30051, map[string]string{"holder_uid": "", "holder": "", "free": "true"}},
	}
	for _, tc := range notHeld {
		_, err := c.Transfer(ctx, &allocdv1.TransferRequest{From: provisional, To: own("web"),
			ClusterIps: got.ClusterIps, NodePorts: []int32{tc.port}})
		ei, _ := detail[*errdetails.ErrorInfo](err)
		pf, _ := detail[*errdetails.PreconditionFailure](err)
		ok := status.Code(err) == codes.FailedPrecondition && ei.GetReason() == "NOT_OWNER" &&
			len(pf.GetViolations()) == 1 && pf.GetViolations()[0].GetSubject() == strconv.Itoa(int(tc.port))
		for k, v := range tc.holder {
			if w, set := ei.GetMetadata()[k]; !set || w != v {
				ok = false
			}
		}
		if !ok {
			t.Errorf("Transfer of %s port = %v (ErrorInfo %v, PreconditionFailure %v); want "+
				"FAILED_PRECONDITION NOT_OWNER with %v", tc.name, err, ei, pf, tc.holder)
		}
	}
	held, _ := c.ListAllocations(ctx, &allocdv1.ListAllocationsRequest{OwnerUid: provisional.Uid})
	if len(held.GetAllocations()) != 2 {
		t.Errorf("refused Transfers moved something: %s holds %v", provisional.Uid, held.GetAllocations())
	}

	for i := range 2 {
		resp, err := c.Transfer(ctx, &allocdv1.TransferRequest{From: provisional, To: own("web")})
		want := i == 0
		if err != nil || (resp.GetRevision() != 0) != want ||
			slices.Equal(resp.GetTransferredClusterIps(), got.ClusterIps) != want ||
			slices.Equal(resp.GetTransferredNodePorts(), got.NodePorts) != want {
			t.Errorf("Transfer #%d = %v, %v; want %v and %v moved the first time, nothing after", i+1, resp,
				err, got.ClusterIps, got.NodePorts)
		}
	}
	web, err := c.ListAllocations(ctx, &allocdv1.ListAllocationsRequest{OwnerUid: "web"})
	if err != nil || len(web.GetAllocations()) != 2 {
		t.Errorf("ListAllocations(owner web) after the transfer = %v, %v; want its 2", web, err)
	}
	list, err = c.ListAllocations(ctx, &allocdv1.ListAllocationsRequest{OwnerUidPrefix: "admission/"})
	if err != nil || len(list.GetAllocations()) != 0 {
		t.Errorf("ListAllocations(prefix admission/) after the transfer = %v, %v; want nothing", list, err)
	}
	for _, req := range []*allocdv1.ListAllocationsRequest{{OwnerUidPrefix: "  "},
		{OwnerUidPrefix: "admission/", OwnerUid: "web"}} {
		_, err := c.ListAllocations(ctx, req)
		br, _ := detail[*errdetails.BadRequest](err)
		if status.Code(err) != codes.InvalidArgument || len(br.GetFieldViolations()) != 1 ||
			br.GetFieldViolations()[0].GetField() != "owner_uid_prefix" {
			t.Errorf("ListAllocations(%v) = %v; want INVALID_ARGUMENT on owner_uid_prefix", req, err)
		}
	}
}
