/* A narrow C face of ISA-L's streaming inflate for rpull-decompress: Rust never sees the layout
 * of `struct inflate_state` (about 40 KiB, version-dependent), only an opaque pointer. */
#include <stdint.h>
#include <stdlib.h>
#include <isa-l/igzip_lib.h>

/* A new gzip (RFC 1952) inflater, header and trailer checked by ISA-L; NULL when out of memory. */
struct inflate_state *rpull_isal_gzip_new(void)
{
	struct inflate_state *state = malloc(sizeof *state);
	if (state == NULL)
		return NULL;
	isal_inflate_init(state);
	state->crc_flag = ISAL_GZIP;
	return state;
}

/* Ready for the next gzip member of a multi-member stream. */
void rpull_isal_gzip_reset(struct inflate_state *state)
{
	isal_inflate_reset(state);
	state->crc_flag = ISAL_GZIP;
}

void rpull_isal_gzip_free(struct inflate_state *state)
{
	free(state);
}

/* One isal_inflate call over `input` into `output`. Sets what was consumed and produced, and
 * whether the member is complete (its trailer checked). Returns ISA-L's status (0 or a negative
 * ISAL_* error). Lengths above 4 GiB are clamped: the caller loops. */
int rpull_isal_gzip_inflate(struct inflate_state *state, const uint8_t *input, size_t input_len,
			    size_t *consumed, uint8_t *output, size_t output_len,
			    size_t *produced, int *member_end)
{
	uint32_t avail_in = input_len > UINT32_MAX ? UINT32_MAX : (uint32_t)input_len;
	uint32_t avail_out = output_len > UINT32_MAX ? UINT32_MAX : (uint32_t)output_len;
	state->next_in = (uint8_t *)input;
	state->avail_in = avail_in;
	state->next_out = output;
	state->avail_out = avail_out;
	int status = isal_inflate(state);
	*consumed = avail_in - state->avail_in;
	*produced = avail_out - state->avail_out;
	*member_end = state->block_state == ISAL_BLOCK_FINISH;
	return status;
}
