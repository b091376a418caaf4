package call

// Transient is transient, for the external tests.
var Transient = transient
