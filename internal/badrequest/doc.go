// Package badrequest is the one shape of a request that fails validation, shared by
// allocd's packages and its server: the bad fields, each named as the API spells it
// (snapshot.services[3].uid), with what is wrong. The server sends it as
// INVALID_ARGUMENT with a google.rpc.BadRequest detail; nothing of the request was
// applied.
//
//	inv := &badrequest.Error{}
//	if req.UID == "" {
//		inv.Add("owner.uid", "required")
//	}
//	return inv.OrNil()
package badrequest
