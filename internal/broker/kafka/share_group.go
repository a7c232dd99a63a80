package kafka

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A share group's own configs, read and set through the brokers: where it
// starts, how many deliveries it allows, how long a record stays locked; and
// its backlog.

// The group configs of a share group that the sidecar reads, and the
// brokers' defaults they fall back to.
const (
	shareConfigLimit   = "share.delivery.count.limit"
	shareConfigLock    = "share.record.lock.duration.ms"
	shareConfigReset   = "share.auto.offset.reset"
	shareDefaultsLimit = "group.share.delivery.count.limit"
	shareDefaultsLock  = "group.share.record.lock.duration.ms"
)

// Kafka's own defaults, when neither the group nor the brokers say.
const (
	defaultShareLimit = 5
	defaultShareLock  = 30 * time.Second
)

// ShareLimits are what the brokers do with a share group's records: a
// record delivered Limit times and not acknowledged is archived, and a
// record acquired is another member's after Lock unless renewed.
type ShareLimits struct {
	Limit int
	Lock  time.Duration
	// From says where they were read: "group", "brokers" or "defaults"
	// (nothing could be read).
	From string
}

// groupConfig is one config of a group as the brokers describe it.
type groupConfig struct {
	value string
	// own: set on the group itself, not the brokers' value it falls back
	// to (source DEFAULT_CONFIG).
	own bool
}

// describeGroupConfigs reads names of group's configs; a name the brokers
// answer no value for is absent.
func describeGroupConfigs(ctx context.Context, cl *kgo.Client, group string, names ...string) (map[string]groupConfig, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	res.ConfigNames = names
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("describe the group's configs: %w", err)
	}
	out := map[string]groupConfig{}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return nil, fmt.Errorf("describe the group's configs: %w", err)
		}
		for _, c := range r.Configs {
			if c.Value != nil && *c.Value != "" {
				out[c.Name] = groupConfig{value: *c.Value, own: c.Source != kmsg.ConfigSourceDefaultConfig}
			}
		}
	}
	return out, nil
}

// SetGroupConfig sets one config of group (a share group's
// share.auto.offset.reset, say) on the brokers.
func SetGroupConfig(ctx context.Context, cl *kgo.Client, group, name, value string) error {
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Op, c.Value = name, kmsg.IncrementalAlterConfigOpSet, kmsg.StringPtr(value)
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		for _, r := range resp.Resources {
			if err = kerr.ErrorForCode(r.ErrorCode); err != nil {
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("set the group's %s: %w", name, err)
	}
	return nil
}

// readShareLimits reads the group's delivery limit and lock duration: the
// group's configs, which Kafka answers with the brokers' value where the
// group sets none; else each broker's own config (static or dynamic); else
// Kafka's defaults.
func readShareLimits(ctx context.Context, cl *kgo.Client, group string) (ShareLimits, error) {
	out := ShareLimits{Limit: defaultShareLimit, Lock: defaultShareLock, From: "defaults"}
	cs, err := describeGroupConfigs(ctx, cl, group, shareConfigLimit, shareConfigLock)
	if err != nil {
		return out, err
	}
	limit, lock := cs[shareConfigLimit].value, cs[shareConfigLock].value
	if limit != "" || lock != "" {
		out.From = "brokers"
		if cs[shareConfigLimit].own || cs[shareConfigLock].own {
			out.From = "group"
		}
	}
	if limit == "" || lock == "" {
		adm := kadm.NewClient(cl)
		brokers, err := adm.ListBrokers(ctx)
		if err != nil {
			return out, fmt.Errorf("list the brokers: %w", err)
		}
		bs, err := adm.DescribeBrokerConfigs(ctx, brokers.NodeIDs()...)
		if err != nil {
			return out, fmt.Errorf("describe the brokers' configs: %w", err)
		}
		for _, r := range bs {
			for _, c := range r.Configs {
				if c.Value == nil || *c.Value == "" {
					continue
				}
				switch {
				case c.Key == shareDefaultsLimit && limit == "":
					limit, out.From = *c.Value, "brokers"
				case c.Key == shareDefaultsLock && lock == "":
					lock, out.From = *c.Value, "brokers"
				}
			}
		}
	}
	if n, err := strconv.Atoi(limit); err == nil && n > 0 {
		out.Limit = n
	}
	if ms, err := strconv.ParseInt(lock, 10, 64); err == nil && ms > 0 {
		out.Lock = time.Duration(ms) * time.Millisecond
	}
	return out, nil
}

// shareStart reads where the share group starts when it has consumed
// nothing (its share.auto.offset.reset, Kafka's default latest) and, with
// apply, sets it to from when it says otherwise: the default would skip
// every record produced before the group's first member joined.
func shareStart(ctx context.Context, cl *kgo.Client, group, from string, apply bool) (was string, changed bool, err error) {
	cs, err := describeGroupConfigs(ctx, cl, group, shareConfigReset)
	if err != nil {
		return "", false, err
	}
	was = "latest"
	if c, ok := cs[shareConfigReset]; ok {
		was = c.value
	}
	if was == from || !apply {
		return was, false, nil
	}
	if err := SetGroupConfig(ctx, cl, group, shareConfigReset, from); err != nil {
		return was, false, err
	}
	return was, true, nil
}

// shareLag reads the share group's offsets and returns how a partition's
// backlog is counted from them: the records past its share-partition start
// not yet acknowledged, as the brokers count them, or all the partition
// holds when the group has not consumed it yet (and starts at the
// earliest record).
func (c *Client) shareLag(ctx context.Context, adm *kadm.Client) (func(end kadm.ListedOffset, starts kadm.ListedOffsets) int64, error) {
	described, err := adm.DescribeShareGroupOffsets(ctx, c.o.Group)
	if err != nil {
		return nil, fmt.Errorf("describe the share group's offsets: %w", err)
	}
	offsets := described[c.o.Group].Offsets
	return func(end kadm.ListedOffset, starts kadm.ListedOffsets) int64 {
		o, ok := offsets.Lookup(end.Topic, end.Partition)
		switch {
		case !ok || o.Err != nil || o.StartOffset < 0:
			if s, ok := starts.Lookup(end.Topic, end.Partition); ok && s.Err == nil && !c.o.StartAtEnd {
				return max(end.Offset-s.Offset, 0)
			}
			return 0
		case o.Lag >= 0:
			return o.Lag
		default:
			return max(end.Offset-o.StartOffset, 0)
		}
	}, nil
}
