package compactor

import (
	"regexp"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// alarmRE finds the alarm type in an entry of a status answer's Errors: etcd adds one
// entry per raised alarm, the AlarmMember in protobuf text, "memberID:8211... alarm:NOSPACE"
// (etcdserver/api/v3rpc/maintenance.go; the text format may put a space after the colon).
var alarmRE = regexp.MustCompile(`\balarm:\s*([A-Z_]+)`)

// Alarms returns the alarms (NOSPACE, CORRUPT) a member's status lists, once per
// member that raised them. A member knows every member's alarms (etcd replicates them),
// and a status read is answered locally: unlike AlarmList, which etcd runs through raft
// (a log entry and an fsync on every member), it costs etcd nothing.
func Alarms(st *clientv3.StatusResponse) []string {
	var out []string
	for _, e := range st.Errors {
		if m := alarmRE.FindStringSubmatch(e); m != nil {
			out = append(out, m[1])
		}
	}
	return out
}
