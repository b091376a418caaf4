package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

func newRelease(o *options) *cobra.Command {
	var owner, uid string
	var force, allUIDs bool
	cmd := &cobra.Command{
		Use:   "release --owner NS/NAME [IP|PORT...]",
		Short: "Release ClusterIPs and NodePorts of an owner (or, with --force, of whoever holds them)",
		Long: `Release addresses and ports (Release). Without IP or PORT, everything the owner holds.

Release is owner-checked by UID. With --uid the owner is that UID, and the command
first checks that what the UID holds is --owner's (refusing, releasing nothing, when
it is not). Without it the command finds the UID: it asks who holds each IP or PORT
named (and refuses when it is not --owner), or, with none named, reads every
allocation to find the owner's. A Service deleted and created again under its name
has a new UID: when --owner's allocations carry more than one UID, nothing is
released and the UIDs are listed; give --uid, or --all-uids to release them all.
Releasing what is free is not an error.

--force releases the IPs and PORTs named whoever holds them (then --owner is refused:
it would not be checked), or everything of --owner (ForceRelease: with authorization
on, a policy grants it to operators apart from Release). The Service that still uses
a forced address keeps it in its spec: repair reports it (ClusterIPNotAllocated) and
allocates it again.`,
		Example: `  allocd release --owner default/web                 # all of default/web's
  allocd release --owner default/db 10.0.0.10 30010   # two of default/db's
  allocd release --owner default/db --uid uid-db 10.0.0.10
  allocd release --force 10.0.0.10                    # whoever holds it`,
		Args: cobra.ArbitraryArgs,
		RunE: runE(o, func(ctx context.Context, s *session, args []string) error {
			it := parseItems(args)
			var ref ownerRef
			switch {
			case owner == "" && (!force || it.empty()):
				return usage(s.cmd, errors.New("missing --owner NAMESPACE/NAME (only --force with the IPs "+
					"or PORTs to release goes without)"))
			case owner != "" && force && !it.empty():
				return usage(s.cmd, errors.New("--owner with --force and IPs or PORTs: --force releases "+
					"them whoever holds them, so --owner would not be checked; drop one of the two"))
			case owner != "":
				var err error
				if ref, err = parseOwner(owner); err != nil {
					return usage(s.cmd, err)
				}
			}
			groups, err := releaseGroups(ctx, s, releaseWhat{ref: ref, uid: uid, allUIDs: allUIDs}, args,
				force)
			if err != nil {
				return err
			}
			return release(ctx, s, ref, groups, force)
		}),
	}
	cmd.Flags().StringVar(&owner, "owner", "",
		"owner whose allocations are released, NAMESPACE/NAME (optional with --force and IPs or PORTs)")
	cmd.Flags().StringVar(&uid, "uid", "", "UID of --owner: skips finding it")
	cmd.Flags().BoolVar(&force, "force", false, "release whoever holds them (ForceRelease)")
	cmd.Flags().BoolVar(&allUIDs, "all-uids", false,
		"with --owner and no IP or PORT: release under every UID --owner's allocations carry")
	return cmd
}

// releaseGroup is one Release call: an owner and what of it to release (all when
// items is empty).
type releaseGroup struct {
	owner *allocdv1.Owner
	items items
	free  []string // named, already free: nothing to do
}

// releaseWhat is whose allocations a release is for.
type releaseWhat struct {
	ref     ownerRef
	uid     string // --uid
	allUIDs bool   // --all-uids
}

// releaseGroups finds the owners' UIDs the release needs, one group per UID.
func releaseGroups(ctx context.Context, s *session, w releaseWhat, args []string,
	force bool) ([]releaseGroup, error) {
	it := parseItems(args)
	owner := &allocdv1.Owner{Namespace: w.ref.namespace, Name: w.ref.name, Uid: w.uid}
	switch {
	case force && !it.empty():
		return []releaseGroup{{owner: owner, items: it}}, nil
	case w.uid != "":
		if err := checkUID(ctx, s, w.ref, w.uid); err != nil {
			return nil, err
		}
		return []releaseGroup{{owner: owner, items: it}}, nil
	case it.empty():
		uids, err := ownerUIDs(ctx, s, w.ref)
		if err == nil && len(uids) > 1 && !w.allUIDs {
			return nil, s.fail("release", false, status.Errorf(codes.FailedPrecondition,
				"%s's allocations carry %d UIDs (%s): a Service deleted and created again under its name; "+
					"nothing released: give --uid, or --all-uids to release them all", w.ref, len(uids),
				strings.Join(uids, ", ")))
		}
		var groups []releaseGroup
		for _, u := range uids {
			groups = append(groups,
				releaseGroup{owner: &allocdv1.Owner{Namespace: w.ref.namespace, Name: w.ref.name, Uid: u}})
		}
		return groups, err
	}
	return holders(ctx, s, w.ref, args)
}

// checkUID refuses a --uid whose allocations are not ref's: a mistyped UID would
// release another owner's.
func checkUID(ctx context.Context, s *session, ref ownerRef, uid string) error {
	page, err := call(ctx, s.o, func(ctx context.Context) (*allocdv1.ListAllocationsResponse, error) {
		return s.c.ListAllocations(ctx, &allocdv1.ListAllocationsRequest{OwnerUid: uid})
	})
	if err != nil {
		return s.fail("release: find the allocations of uid "+uid, false, err)
	}
	for _, a := range page.GetAllocations() {
		if !ref.is(a.GetOwner()) {
			return s.fail("release", false, status.Errorf(codes.FailedPrecondition,
				"uid %s holds allocations of %s, not of %s: nothing released", uid, ownerName(a.GetOwner()),
				ref))
		}
	}
	return nil
}

// ownerUIDs lists every allocation to find the UIDs that ref's allocations carry.
func ownerUIDs(ctx context.Context, s *session, ref ownerRef) ([]string, error) {
	var uids []string
	req := &allocdv1.ListAllocationsRequest{PageSize: 5000}
	err := pages(ctx, s, "release: find the allocations of "+ref.String(), &req.PageToken,
		func(ctx context.Context) (*allocdv1.ListAllocationsResponse, error) {
			return s.c.ListAllocations(ctx, req)
		}, func(page *allocdv1.ListAllocationsResponse) error {
			for _, a := range page.GetAllocations() {
				if u := a.GetOwner().GetUid(); ref.is(a.GetOwner()) && !slices.Contains(uids, u) {
					uids = append(uids, u)
				}
			}
			return nil
		})
	if err != nil {
		return nil, err
	}
	return uids, nil
}

// holders asks who holds each of args: every one held must be ref's (one group per
// UID); free ones are noted.
func holders(ctx context.Context, s *session, ref ownerRef, args []string) ([]releaseGroup, error) {
	var groups []releaseGroup
	var free []string
	for _, arg := range args {
		a, err := call(ctx, s.o, func(ctx context.Context) (*allocdv1.Allocation, error) {
			return s.c.GetAllocation(ctx, getRequest(arg))
		})
		switch {
		case errors.Is(err, client.ErrNotFound):
			free = append(free, arg)
			continue
		case err != nil:
			return nil, s.fail("release: find who holds "+arg, false, err)
		case !ref.is(a.GetOwner()):
			return nil, s.fail("release", false, status.Errorf(codes.FailedPrecondition,
				"%s is held by %s (uid %s), not by %s: nothing released; --force "+
					"releases it whoever holds it",
				arg, ownerName(a.GetOwner()), a.GetOwner().GetUid(), ref))
		}
		i := 0
		for i < len(groups) && groups[i].owner.GetUid() != a.GetOwner().GetUid() {
			i++
		}
		if i == len(groups) {
			groups = append(groups, releaseGroup{owner: a.GetOwner()})
		}
		groups[i].items.add(arg)
	}
	if len(groups) == 0 {
		return []releaseGroup{{free: free}}, nil
	}
	groups[0].free = free
	return groups, nil
}

// release runs the groups' Releases and says what each freed.
func release(ctx context.Context, s *session, ref ownerRef, groups []releaseGroup, force bool) error {
	all := &allocdv1.ReleaseResponse{}
	for _, g := range groups {
		if !s.o.structured() && len(g.free) > 0 {
			fmt.Fprintf(s.out, "already free: %s\n", strings.Join(g.free, ", "))
		}
		if g.owner == nil {
			continue
		}
		resp, err := callWrite(ctx, s.o, func(ctx context.Context) (*allocdv1.ReleaseResponse, error) {
			return s.c.Release(ctx, &allocdv1.ReleaseRequest{Owner: g.owner, ClusterIps: g.items.ips,
				NodePorts: g.items.ports, Force: force})
		})
		if err != nil {
			return s.fail("release", true, err)
		}
		all.ReleasedClusterIps = append(all.ReleasedClusterIps, resp.GetReleasedClusterIps()...)
		all.ReleasedNodePorts = append(all.ReleasedNodePorts, resp.GetReleasedNodePorts()...)
		all.Revision = max(all.Revision, resp.GetRevision())
		if !s.o.structured() {
			fmt.Fprintln(s.out, releasedLine(g.owner, resp, force))
		}
	}
	if len(groups) == 0 && !s.o.structured() {
		fmt.Fprintf(s.out, "nothing to release: %s holds nothing\n", ref)
	}
	if s.o.structured() {
		return printObject(s.out, s.o.output, all)
	}
	return nil
}

// releasedLine says what one Release freed.
func releasedLine(owner *allocdv1.Owner, resp *allocdv1.ReleaseResponse, force bool) string {
	got := itemList(resp.GetReleasedClusterIps(), resp.GetReleasedNodePorts())
	who := ""
	if owner.GetUid() != "" {
		who = fmt.Sprintf(" of %s (uid %s)", ownerName(owner), owner.GetUid())
	}
	if force {
		who += " (forced)"
	}
	if len(got) == 0 {
		return "nothing released" + who + ": already free"
	}
	return fmt.Sprintf("released %s%s at revision %d", strings.Join(got, ", "), who, resp.GetRevision())
}
